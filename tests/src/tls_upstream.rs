//! An `https://` front for an upstream double, since wiremock speaks plain
//! HTTP only: TLS is terminated here, under a certificate for `127.0.0.1`
//! issued by a CA made for the test, and the bytes are relayed to the
//! double over plain TCP. It counts the TLS connections it accepted, so a
//! test can see whether the host reused one.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// A running front; stops when dropped.
pub struct TlsFront {
    addr: SocketAddr,
    ca_pem: String,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// A front on a free 127.0.0.1 port relaying to `backend`.
    pub async fn start(backend: SocketAddr) -> TlsFront {
        let (ca_pem, certificate, key) = issue_for_loopback();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![certificate], key)
            .expect("a certificate and its key");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("an address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            loop {
                // A failed accept (an aborted connection) ends nothing.
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut plain) = TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront {
            addr,
            ca_pem,
            accepted,
            task,
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The issuing CA's certificate, PEM: what a client must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// TCP connections accepted so far (a failed handshake counts too).
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A CA (its certificate as PEM) and a certificate it issued for the IP
/// address `127.0.0.1`, with that certificate's key.
fn issue_for_loopback() -> (String, CertificateDer<'static>, PrivateKeyDer<'static>) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "socialgate test upstream CA");
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let ca = ca_params.self_signed(&ca_key).expect("a CA certificate");

    let leaf_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("leaf params");
    let leaf_key = rcgen::KeyPair::generate().expect("a leaf key");
    let leaf = leaf_params
        .signed_by(&leaf_key, &ca, &ca_key)
        .expect("a certificate issued by the CA");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    (ca.pem(), leaf.der().clone(), key)
}
