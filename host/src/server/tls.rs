//! TLS for the public listener (`[server] tls_cert` and `tls_key`, PEM
//! files), with rustls: ALPN offers `h2` and `http/1.1`. The pair is read at
//! start (a bad pair ends the start) and read again whenever either file
//! changes on disk, so a rotated certificate is served without a restart;
//! a changed pair that cannot be used is logged and the one in use stays.
//!
//! The files are looked at once a second rather than through change events,
//! because rotations often swap a symlink (Kubernetes secrets, certbot) that
//! a watch on the old file would miss; handshakes only load the current pair.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How often the files are looked at.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The configured PEM files, resolved against the config's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why a certificate and key cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}: holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path}: holds no PEM private key (is it the certificate?)")]
    NoKey { path: PathBuf },
    #[error("{path}: the private key is not usable: {message}")]
    Key { path: PathBuf, message: String },
    #[error("{cert}: the certificate does not match the key in {key}")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("cannot set up TLS: {0}")]
    Setup(String),
}

/// The listener's TLS: an acceptor whose certificate follows the files.
pub struct Tls {
    acceptor: TlsAcceptor,
    current: Arc<Current>,
}

/// The pair in use, swapped whole when the files change.
#[derive(Debug)]
struct Current {
    files: TlsFiles,
    key: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key.load_full())
    }
}

impl Tls {
    /// Reads the pair and builds the acceptor.
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let current = Arc::new(Current {
            files: files.clone(),
            key: ArcSwap::from_pointee(read_pair(files)?),
        });
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            current,
        })
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// Reads the pair again whenever a file changes, until `shutdown`.
    pub async fn follow_files(&self, shutdown: CancellationToken) {
        let files = &self.current.files;
        let mut seen = stamps(files);
        let mut every = tokio::time::interval(CHECK_EVERY);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let now = stamps(files);
            if now == seen {
                continue;
            }
            seen = now;
            match read_pair(files) {
                Ok(pair) => {
                    self.current.key.store(Arc::new(pair));
                    tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
                }
                // A rotation may be half done (the certificate written,
                // not yet its key): the next change is tried again.
                Err(e) => {
                    tracing::warn!("TLS certificate not reloaded, the previous one stays: {e}")
                }
            }
        }
    }
}

/// When and how big each file is: a change of either means read again.
fn stamps(files: &TlsFiles) -> [Option<(SystemTime, u64)>; 2] {
    [&files.cert, &files.key].map(|path| {
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    })
}

/// The certificate chain and its key, checked to belong together.
fn read_pair(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let read_error = |path: &Path, e: rustls_pki_types::pem::Error| TlsError::Read {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| read_error(&files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_error(&files.cert, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: files.cert.clone(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| match e {
        // "no items found": a file that reads, with no key in it (a
        // certificate given as the key, say).
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            path: files.key.clone(),
        },
        e => read_error(&files.key, e),
    })?;
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| TlsError::Key {
            path: files.key.clone(),
            message: e.to_string(),
        })?;
    let pair = CertifiedKey::new(chain, signing);
    pair.keys_match().map_err(|_| TlsError::Mismatch {
        cert: files.cert.clone(),
        key: files.key.clone(),
    })?;
    Ok(pair)
}
