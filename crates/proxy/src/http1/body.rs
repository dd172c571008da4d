//! Message bodies relayed verbatim: exactly as many bytes as the framing says (a length,
//! the chunked encoding found by [`ChunkedScanner`] without decoding it, or until close),
//! with an idle timeout, and nothing beyond the body's end consumed; a request body
//! searched for placeholders bound elsewhere on the way, when a credential asks for it,
//! and refused if chunked with extensions or trailers, which that search does not read.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::h1::framing::{BodyKind, ChunkError, ChunkedScanner};

/// Read size while relaying bodies.
const RELAY_CHUNK: usize = 64 * 1024;

/// Why a body relay stopped early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    #[error("reading the body failed: {0}")]
    Source(std::io::Error),
    #[error("writing the body failed: {0}")]
    Dest(std::io::Error),
    #[error("the body ended early")]
    Truncated,
    #[error("bad chunked framing: {0}")]
    Framing(ChunkError),
    #[error("the body stalled")]
    Idle,
    /// The receiving side took nothing for the idle time.
    #[error("the receiver stopped reading")]
    Stalled,
    /// The body carried a placeholder bound to another host; the bytes that completed it
    /// were not written.
    #[error("{0}")]
    Leak(sandgate_policy::Leak),
}

/// Copies one message body from `src` (starting with what is already in `buf`) to `dst`,
/// unchanged, and stops exactly at its end, flushed (a TLS stream keeps what it could not
/// send yet until flushed). Returns the bytes copied. A read or a write that makes no
/// progress for `idle` ends it: a peer that stops reading holds nothing for longer.
/// `scanner` finds a chunked body's end: [`ChunkedScanner::for_request`] for a request's.
pub(crate) async fn relay_body<R, W>(
    src: &mut R,
    buf: &mut BytesMut,
    dst: &mut W,
    kind: BodyKind,
    mut scanner: ChunkedScanner,
    idle: std::time::Duration,
    mut scan: Option<&mut sandgate_policy::BodyScan>,
) -> Result<u64, RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut copied = 0u64;
    let mut remaining = match kind {
        BodyKind::Empty => return flush(dst, idle).await.map(|()| 0),
        BodyKind::Length(n) => n,
        BodyKind::Chunked | BodyKind::UntilClose => u64::MAX,
    };
    loop {
        if buf.is_empty() {
            buf.reserve(RELAY_CHUNK);
            let n = match tokio::time::timeout(idle, src.read_buf(buf)).await {
                Err(_) => return Err(RelayError::Idle),
                Ok(Err(e)) => return Err(RelayError::Source(e)),
                Ok(Ok(n)) => n,
            };
            if n == 0 {
                return match kind {
                    BodyKind::UntilClose => {
                        flush(dst, idle).await?;
                        Ok(copied)
                    }
                    _ => Err(RelayError::Truncated),
                };
            }
        }
        // The body's data (without the chunked framing, which could split a placeholder)
        // is searched before any of it is written.
        let mut leak = None;
        let mut search = |data: &[u8]| {
            if let Some(scan) = scan.as_deref_mut()
                && leak.is_none()
            {
                leak = scan.feed(data).err();
            }
        };
        let take = match kind {
            BodyKind::Chunked => scanner.feed_with(buf, &mut search).map_err(RelayError::Framing)?,
            _ => {
                let take = usize::try_from(remaining).unwrap_or(usize::MAX).min(buf.len());
                search(buf.get(..take).unwrap_or_default());
                take
            }
        };
        if let Some(leak) = leak {
            return Err(RelayError::Leak(leak));
        }
        match tokio::time::timeout(idle, dst.write_all(buf.get(..take).unwrap_or_default())).await {
            Err(_) => return Err(RelayError::Stalled),
            Ok(Err(e)) => return Err(RelayError::Dest(e)),
            Ok(Ok(())) => {}
        }
        buf.advance(take);
        copied += take as u64;
        if matches!(kind, BodyKind::Length(_)) {
            remaining -= take as u64;
        }
        let done = match kind {
            BodyKind::Chunked => scanner.is_done(),
            BodyKind::Length(_) => remaining == 0,
            _ => false,
        };
        if done {
            flush(dst, idle).await?;
            return Ok(copied);
        }
    }
}

async fn flush<W: AsyncWrite + Unpin>(dst: &mut W, idle: std::time::Duration) -> Result<(), RelayError> {
    match tokio::time::timeout(idle, dst.flush()).await {
        Err(_) => Err(RelayError::Stalled),
        Ok(r) => r.map_err(RelayError::Dest),
    }
}
