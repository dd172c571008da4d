//! Listens for other proxies' changes: one dedicated connection that runs
//! `LISTEN sandgate_exceptions` and wakes the control plane on every notification.
//!
//! A notification's payload is ignored: it only says "read again", so a forged one (anyone
//! who may connect to the database can send it) can cost a re-read and nothing else. A lost
//! connection is made again with exponential back-off (bounded at 5 s); each time it is
//! (re)established the control plane is woken too, since notifications sent while it was
//! down are lost.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Config, NoTls, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::CHANNEL;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Listens until the task is aborted (when the store is dropped).
pub(super) async fn run(config: Config, tls: Option<MakeRustlsConnect>, changed: Arc<Notify>, name: String) {
    let mut backoff = FIRST_BACKOFF;
    let mut down = false;
    loop {
        let (listened, error) = match &tls {
            Some(tls) => listen_once(&config, tls.clone(), &changed).await,
            None => listen_once(&config, NoTls, &changed).await,
        };
        if listened {
            backoff = FIRST_BACKOFF;
        }
        if !down {
            match &error {
                Some(e) => {
                    tracing::warn!(store = %name, error = %e, "exception store: listening for changes failed; retrying")
                }
                None => {
                    tracing::warn!(store = %name, "exception store: the listening connection ended; retrying")
                }
            }
        }
        down = !listened;
        // A wake now makes the control plane find out at once whether the store answers.
        changed.notify_one();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection's life: whether `LISTEN` succeeded, and the error that ended it.
async fn listen_once<T>(config: &Config, tls: T, changed: &Notify) -> (bool, Option<tokio_postgres::Error>)
where
    T: MakeTlsConnect<Socket>,
    T::Stream: AsyncRead + AsyncWrite + Unpin + Send,
    T::TlsConnect: TlsConnect<Socket> + Send,
{
    let (client, mut connection) = match config.connect(tls).await {
        Ok(c) => c,
        Err(e) => return (false, Some(e)),
    };
    let mut listened = false;
    let drive = async {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(_))) => changed.notify_one(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Some(e),
                None => return None,
            }
        }
    };
    let listen = async {
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        listened = true;
        // Routine, at start and after each reconnect: not news for the default level.
        tracing::debug!("exception store: listening for other proxies' changes");
        changed.notify_one();
        std::future::pending::<Result<(), tokio_postgres::Error>>().await
    };
    let error = tokio::select! {
        e = drive => e,
        r = listen => r.err(),
    };
    (listened, error)
}
