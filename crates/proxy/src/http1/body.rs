//! Message bodies relayed verbatim: exactly as many bytes as the framing says (a length,
//! the chunked encoding found by [`ChunkedScanner`] without decoding it, or until close),
//! with an idle timeout, and nothing beyond the body's end consumed.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::framing::{BodyKind, ChunkError, ChunkedScanner};

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
}

/// Copies one message body from `src` (starting with what is already in `buf`) to `dst`,
/// unchanged, and stops exactly at its end. Returns the bytes copied.
pub(crate) async fn relay_body<R, W>(
    src: &mut R,
    buf: &mut BytesMut,
    dst: &mut W,
    kind: BodyKind,
    idle: std::time::Duration,
) -> Result<u64, RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut copied = 0u64;
    let mut remaining = match kind {
        BodyKind::Empty => return Ok(0),
        BodyKind::Length(n) => n,
        BodyKind::Chunked | BodyKind::UntilClose => u64::MAX,
    };
    let mut scanner = ChunkedScanner::new();
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
                        dst.flush().await.map_err(RelayError::Dest)?;
                        Ok(copied)
                    }
                    _ => Err(RelayError::Truncated),
                };
            }
        }
        let take = match kind {
            BodyKind::Chunked => scanner.feed(buf).map_err(RelayError::Framing)?,
            _ => usize::try_from(remaining).unwrap_or(usize::MAX).min(buf.len()),
        };
        dst.write_all(buf.get(..take).unwrap_or_default())
            .await
            .map_err(RelayError::Dest)?;
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
            return Ok(copied);
        }
    }
}
