//! A private PKI made at test time, and a TLS-terminating proxy in front of the ClickHouse
//! under test, so https can be tested without the internet.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::Target;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate authority and the files of what it issued, in a directory of the test's own.
pub struct Pki {
    pub dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate chain and its key.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

impl Pki {
    pub fn new(label: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!(
            "pki-{label}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&dir).expect("pki dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("Test CA {label}"));
        let ca =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write ca");
        Pki { dir, ca }
    }

    /// The CA certificate as a PEM file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A server certificate for `names`; `expired` makes one that ended in 2021.
    pub fn server(&self, name: &str, names: &[&str], expired: bool) -> Identity {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        self.issue(name, params)
    }

    /// A client certificate for mutual TLS.
    pub fn client(&self, name: &str) -> Identity {
        let mut params = CertificateParams::new(vec![name.to_string()]).expect("params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(name, params)
    }

    fn issue(&self, name: &str, params: CertificateParams) -> Identity {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("sign");
        let cert_path = self.dir.join(format!("{name}.pem"));
        let key_path = self.dir.join(format!("{name}.key"));
        std::fs::write(&cert_path, cert.pem()).expect("write cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        Identity {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            cert_path,
            key_path,
        }
    }

    /// A server configuration presenting `identity`; with `client_ca`, client certificates
    /// issued by this CA are required.
    pub fn server_config(
        &self,
        identity: &Identity,
        require_client_cert: bool,
    ) -> Arc<ServerConfig> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions");
        let builder = if require_client_cert {
            let mut roots = RootCertStore::empty();
            roots.add(self.ca.der().clone()).expect("ca root");
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .expect("verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(
            builder
                .with_single_cert(identity.chain.clone(), identity.key.clone_key())
                .expect("server cert"),
        )
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// Terminates TLS on a local port and forwards the bytes to the ClickHouse under test.
pub struct TlsProxy {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
    handshakes: Arc<std::sync::atomic::AtomicUsize>,
}

impl TlsProxy {
    pub async fn start(config: Arc<ServerConfig>, upstream: Target) -> TlsProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let handshakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&handshakes);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let upstream = upstream.clone();
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    // Small requests and answers: no Nagle delays on either leg.
                    client.set_nodelay(true).ok();
                    // A failed handshake is what several tests are about: just close.
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Ok(tcp) = TcpStream::connect((upstream.host.as_str(), upstream.port)).await
                    else {
                        return;
                    };
                    tcp.set_nodelay(true).ok();
                    if upstream.secure {
                        let mut roots = RootCertStore::empty();
                        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                        let client_config = rustls::ClientConfig::builder_with_provider(provider())
                            .with_safe_default_protocol_versions()
                            .expect("versions")
                            .with_root_certificates(roots)
                            .with_no_client_auth();
                        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
                        let Ok(name) =
                            rustls::pki_types::ServerName::try_from(upstream.host.clone())
                        else {
                            return;
                        };
                        if let Ok(mut up) = connector.connect(name, tcp).await {
                            let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                        }
                    } else {
                        let mut up = tcp;
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                    }
                });
            }
        });
        TlsProxy {
            addr,
            task,
            handshakes,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// TLS handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
