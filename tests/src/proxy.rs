//! A forward HTTP proxy on loopback, for the proxy tests: `CONNECT` tunnels (https) and plain
//! requests in the absolute form (http), one request per connection. It goes only to this
//! machine: a request for anywhere else is answered 403 and recorded, so a test whose refusal
//! broke still sends nothing off it.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy was asked: the request line and the `Proxy-Authorization` header, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    pub line: String,
    pub authorization: Option<String>,
}

pub struct ForwardProxy {
    pub addr: SocketAddr,
    asked: Arc<Mutex<Vec<Asked>>>,
    task: JoinHandle<()>,
}

impl ForwardProxy {
    pub async fn start() -> ForwardProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let _ = serve(client, seen).await;
                });
            }
        });
        ForwardProxy { addr, asked, task }
    }

    /// `http://127.0.0.1:PORT`, for the proxy variables.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn asked(&self) -> Vec<Asked> {
        self.asked.lock().map(|a| a.clone()).unwrap_or_default()
    }
}

impl Drop for ForwardProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut client: TcpStream, seen: Arc<Mutex<Vec<Asked>>>) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte).await? == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default().to_string();
    let headers: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    let authorization = headers.iter().find_map(|h| {
        let (name, value) = h.split_once(':')?;
        name.eq_ignore_ascii_case("proxy-authorization")
            .then(|| value.trim().to_string())
    });
    if let Ok(mut seen) = seen.lock() {
        seen.push(Asked {
            line: line.clone(),
            authorization,
        });
    }
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method == "CONNECT" {
        let Some(mut upstream) = local(target).await else {
            return client.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
        };
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        return Ok(());
    }
    // The absolute form: `POST http://host:port/path HTTP/1.1`, sent on in the origin form.
    let Some(rest) = target.strip_prefix("http://") else {
        return client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let Some(mut upstream) = local(authority).await else {
        return client.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
    };
    let path = if path.is_empty() { "/" } else { path };
    let mut forwarded = format!("{method} {path} HTTP/1.1\r\n");
    for header in headers {
        let name = header.split(':').next().unwrap_or("").to_ascii_lowercase();
        if !matches!(
            name.as_str(),
            "connection" | "proxy-authorization" | "keep-alive"
        ) {
            forwarded += header;
            forwarded += "\r\n";
        }
    }
    forwarded += "Connection: close\r\n\r\n";
    upstream.write_all(forwarded.as_bytes()).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// A connection to `authority` when it is on this machine.
async fn local(authority: &str) -> Option<TcpStream> {
    let (host, port) = authority.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().ok()?;
    let ip: IpAddr = if host.eq_ignore_ascii_case("localhost") {
        IpAddr::from([127, 0, 0, 1])
    } else {
        host.parse().ok()?
    };
    if !ip.is_loopback() {
        return None;
    }
    TcpStream::connect((ip, port)).await.ok()
}
