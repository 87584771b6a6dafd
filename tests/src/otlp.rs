//! An OTLP/HTTP receiver on loopback, for the telemetry tests and the cost bench: it answers
//! every export with 200 and keeps what came, parsed from http/json.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What one export carried.
#[derive(Debug, Clone)]
pub struct Export {
    pub path: String,
    pub content_type: String,
    /// The body parsed (http/json), or its length (http/protobuf).
    pub body: Value,
}

pub struct Receiver {
    pub port: u16,
    exports: Arc<Mutex<Vec<Export>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let exports: Arc<Mutex<Vec<Export>>> = Arc::default();
        let kept = Arc::clone(&exports);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&kept)));
            }
        });
        Receiver {
            port,
            exports,
            task,
        }
    }

    /// The base URL the exporter is given (`/v1/traces` and `/v1/metrics` are added).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn exports(&self) -> Vec<Export> {
        self.exports.lock().expect("exports").clone()
    }

    /// Every span received, from every export.
    pub fn spans(&self) -> Vec<Value> {
        let mut spans = Vec::new();
        for export in self.exports().iter().filter(|e| e.path == "/v1/traces") {
            for resource in array(&export.body["resourceSpans"]) {
                for scope in array(&resource["scopeSpans"]) {
                    spans.extend(array(&scope["spans"]).iter().cloned());
                }
            }
        }
        spans
    }

    /// Every metric received, from every export.
    pub fn metrics(&self) -> Vec<Value> {
        let mut metrics = Vec::new();
        for export in self.exports().iter().filter(|e| e.path == "/v1/metrics") {
            for resource in array(&export.body["resourceMetrics"]) {
                for scope in array(&resource["scopeMetrics"]) {
                    metrics.extend(array(&scope["metrics"]).iter().cloned());
                }
            }
        }
        metrics
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

/// An attribute of a span, an event or a data point, as text (OTLP/JSON writes integers as
/// strings or numbers).
pub fn attribute(item: &Value, key: &str) -> Option<String> {
    array(&item["attributes"])
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| {
            let value = &a["value"];
            for kind in ["stringValue", "intValue", "doubleValue", "boolValue"] {
                match &value[kind] {
                    Value::String(s) => return s.clone(),
                    Value::Null => {}
                    other => return other.to_string(),
                }
            }
            value.to_string()
        })
}

/// HTTP/1.1 requests on one connection, each answered `200 {}`.
async fn serve(mut stream: TcpStream, exports: Arc<Mutex<Vec<Export>>>) {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
        let path = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buffer.drain(..head_end + length).skip(head_end).collect();
        let content_type = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-type")
                    .then(|| value.trim().to_string())
            })
            .unwrap_or_default();
        // http/json is kept parsed; http/protobuf (the cost bench's) only counted.
        let body = match content_type.as_str() {
            "application/json" => serde_json::from_slice(&body).unwrap_or(Value::Null),
            _ => Value::from(body.len()),
        };
        exports.lock().expect("exports").push(Export {
            path,
            content_type,
            body,
        });
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}
