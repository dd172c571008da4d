//! A node-local proxy as an attacker would write one: a valid client certificate, then one
//! HTTP/2 CONNECT stream with whatever fields and bytes the test gives, where sandgate's own
//! node would only send what its policy and forwarder produce.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// What the central answered: the stream's status, then every byte it sent on the stream
/// until it ended it (or `limit` passed).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The node's TLS files and the central's name in its certificate.
#[derive(Debug, Clone, Copy)]
pub struct NodeTls<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub ca: &'a Path,
    pub central_name: &'a str,
}

/// Opens one CONNECT stream for `authority` to the central at `addr` with `fields`, writes
/// `send` on it once it is answered 2xx, and reads what comes back for at most `limit`.
pub async fn stream(
    addr: SocketAddr,
    tls: NodeTls<'_>,
    authority: &str,
    fields: &[(&str, &str)],
    send: &[u8],
    limit: Duration,
) -> Answer {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(tls.ca).expect("ca pem") {
        roots.add(c.expect("ca cert")).expect("ca");
    }
    let chain: Vec<_> = CertificateDer::pem_file_iter(tls.cert)
        .expect("cert pem")
        .map(|c| c.expect("cert"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(tls.key).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client auth");
    config.alpn_protocols = vec![b"h2".to_vec()];
    #[expect(
        clippy::disallowed_methods,
        reason = "a test's node connects to its own central on loopback"
    )]
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from(tls.central_name.to_owned()).expect("name");
    let tls_stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS");
    let (mut sender, connection) = h2::client::handshake(tls_stream).await.expect("h2");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = hyper::Request::connect(authority);
    for (k, v) in fields {
        request = request.header(*k, *v);
    }
    let request = request.body(()).expect("request");
    sender = sender.ready().await.expect("ready");
    let (response, mut send_stream) = sender.send_request(request, false).expect("send");
    let response = response.await.expect("response");
    let status = response.status().as_u16();
    let mut recv = response.into_body();
    if (200..300).contains(&status) {
        send_stream
            .send_data(Bytes::copy_from_slice(send), false)
            .expect("data");
    }
    let mut body = Vec::new();
    let read = async {
        while let Some(Ok(data)) = recv.data().await {
            let _ = recv.flow_control().release_capacity(data.len());
            body.extend_from_slice(&data);
        }
    };
    let _ = tokio::time::timeout(limit, read).await;
    Answer { status, body }
}
