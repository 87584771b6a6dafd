//! TLS for https ClickHouse endpoints: which servers to trust, and an optional client identity.
//!
//! Server certificates and host names are always verified. The roots are the operating
//! system's (or, where it has none, the built-in Mozilla roots), plus an optional CA bundle for
//! private certificate authorities. There is deliberately no option to turn verification off.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::error::{Error, Result};

/// Where trust and identity come from.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of extra CA certificates to trust (a private CA).
    pub ca_bundle: Option<PathBuf>,
    /// PEM file of the client certificate chain, for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// PEM file of the client's private key, for mutual TLS.
    pub client_key: Option<PathBuf>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key's path is not a secret, its content is; nothing here reads it.
        f.debug_struct("TlsOptions")
            .field("ca_bundle", &self.ca_bundle)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl TlsOptions {
    /// The rustls client configuration these options describe.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>> {
        self.read()?.config(true)
    }

    /// The certificates and key the options name, read and parsed.
    fn read(&self) -> Result<TlsFiles> {
        let extra_roots = match &self.ca_bundle {
            Some(path) => Some((path.clone(), read_certs(path, "CA bundle")?)),
            None => None,
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "client certificate")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    Error::InvalidConfig(format!(
                        "client key {}: no usable PEM private key ({e})",
                        key.display()
                    ))
                })?;
                Some((chain, key))
            }
            _ => {
                return Err(Error::InvalidConfig(
                    "mutual TLS needs both a client certificate and a client key".into(),
                ));
            }
        };
        Ok(TlsFiles {
            extra_roots,
            identity,
        })
    }
}

/// What the options' files hold, read once.
struct TlsFiles {
    extra_roots: Option<(PathBuf, Vec<CertificateDer<'static>>)>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

impl TlsFiles {
    /// The configuration, with the system's roots or with none.
    fn config(&self, system_roots: bool) -> Result<Arc<ClientConfig>> {
        let mut roots = RootCertStore::empty();
        if system_roots {
            let native = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(native.certs);
            if added == 0 {
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            }
        }
        if let Some((path, certs)) = &self.extra_roots {
            for cert in certs {
                roots.add(cert.clone()).map_err(|e| {
                    Error::InvalidConfig(format!(
                        "CA bundle {}: a certificate is not usable as a root: {e}",
                        path.display()
                    ))
                })?;
            }
        }
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| Error::InvalidConfig(format!("TLS: {e}")))?
                .with_root_certificates(roots);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| {
                    Error::InvalidConfig(format!(
                        "client certificate and key do not form a usable identity: {e}"
                    ))
                })?,
        };
        Ok(Arc::new(config))
    }
}

/// A client configuration made on the first https connection: the system's roots take
/// milliseconds to load (a CLI call's largest part of its own), and a plain-http ClickHouse
/// never needs them. The options' files are read and checked when it is made, and kept: a bad
/// one is an error at start-up, and nothing is read from them later.
pub struct LazyClientConfig {
    files: TlsFiles,
    config: OnceLock<Arc<ClientConfig>>,
}

impl LazyClientConfig {
    pub fn new(options: &TlsOptions) -> Result<Self> {
        let files = options.read()?;
        files.config(false)?;
        Ok(LazyClientConfig {
            files,
            config: OnceLock::new(),
        })
    }

    /// The configuration, made now if this is the first call. Only the system's roots are new
    /// then, and those are added leniently, so it fails only as the check in `new` would have.
    pub fn get(&self) -> Result<Arc<ClientConfig>> {
        if let Some(config) = self.config.get() {
            return Ok(Arc::clone(config));
        }
        let config = self.files.config(true)?;
        Ok(Arc::clone(self.config.get_or_init(|| config)))
    }

    /// Whether the configuration has been made (the system's roots loaded).
    pub fn is_made(&self) -> bool {
        self.config.get().is_some()
    }
}

impl TlsOptions {
    /// Which option a [`TlsOptions::client_config`] error is about (`ca_bundle`, `client_cert`,
    /// `client_key`), so that a caller can name its own setting for it.
    pub fn culprit(&self) -> Option<&'static str> {
        if let Some(path) = &self.ca_bundle
            && read_certs(path, "CA bundle").is_err()
        {
            return Some("ca_bundle");
        }
        match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(_), None) => Some("client_key"),
            (None, Some(_)) => Some("client_cert"),
            (Some(cert), Some(key)) => {
                if read_certs(cert, "client certificate").is_err() {
                    Some("client_cert")
                } else if PrivateKeyDer::from_pem_file(key).is_err() {
                    Some("client_key")
                } else {
                    // Both read, but they do not make an identity: the pair is wrong.
                    Some("client_cert")
                }
            }
        }
    }
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| Error::InvalidConfig(format!("{what} {}: {e}", path.display())))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::InvalidConfig(format!("{what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_roots_load() {
        assert!(TlsOptions::default().client_config().is_ok());
    }

    #[test]
    fn a_missing_bundle_is_a_clear_error() {
        let options = TlsOptions {
            ca_bundle: Some("/nonexistent/ca.pem".into()),
            ..TlsOptions::default()
        };
        match options.client_config() {
            Err(Error::InvalidConfig(m)) => assert!(m.contains("/nonexistent/ca.pem"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(options.culprit(), Some("ca_bundle"));
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let path = std::env::temp_dir().join(format!("not-a-cert-{}.pem", std::process::id()));
        std::fs::write(&path, "hello").expect("write");
        let options = TlsOptions {
            ca_bundle: Some(path.clone()),
            ..TlsOptions::default()
        };
        assert!(
            matches!(options.client_config(), Err(Error::InvalidConfig(m)) if m.contains("no PEM certificate"))
        );
        std::fs::remove_file(path).ok();
    }

    #[test]
    fn half_an_identity_is_refused() {
        let options = TlsOptions {
            client_cert: Some("/x.pem".into()),
            ..TlsOptions::default()
        };
        assert!(
            matches!(options.client_config(), Err(Error::InvalidConfig(m)) if m.contains("both"))
        );
        assert_eq!(options.culprit(), Some("client_key"));
        let unreadable_key = TlsOptions {
            client_key: Some("/nonexistent/key.pem".into()),
            ..options
        };
        // The certificate is checked first: it is missing too.
        assert_eq!(unreadable_key.culprit(), Some("client_cert"));
        assert_eq!(TlsOptions::default().culprit(), None);
    }

    #[test]
    fn the_lazy_configuration_checks_the_files_at_once_and_loads_roots_on_first_use() {
        let bad = TlsOptions {
            ca_bundle: Some("/nonexistent/ca.pem".into()),
            ..TlsOptions::default()
        };
        assert!(matches!(
            LazyClientConfig::new(&bad),
            Err(Error::InvalidConfig(m)) if m.contains("/nonexistent/ca.pem")
        ));
        let lazy = LazyClientConfig::new(&TlsOptions::default()).expect("no files to read");
        assert!(!lazy.is_made());
        let first = lazy.get().expect("made");
        assert!(lazy.is_made());
        assert!(Arc::ptr_eq(&first, &lazy.get().expect("kept")));
    }
}
