//! [`FaultProxy`]: an HTTP proxy on loopback that injects faults (error answers, stalls,
//! damaged bodies) into the requests it forwards.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the [`FaultProxy`] does to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this HTTP status (and an S3-style XML error body) instead of forwarding.
    Status(u16),
    /// Hold the request this long without answering, then drop the connection.
    Stall(Duration),
    /// Forward the request with one byte of its body flipped (damage on the way).
    CorruptBody,
}

#[derive(Debug, Default)]
struct Rules {
    /// Faults for the next requests, in order.
    next: Vec<Fault>,
    /// A fault for requests whose request line contains the string (the next n, or all).
    matching: Vec<(String, Fault, Option<usize>)>,
}

/// An HTTP proxy on `127.0.0.1` in front of an S3 server that can answer requests with 5xx
/// errors or stall them. It serves one request per connection (`Connection: close`), so each
/// request is seen on its own.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    rules: Arc<Mutex<Rules>>,
    requests: Arc<AtomicU64>,
    faults: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Starts a proxy forwarding to `upstream` (`host:port`).
    pub fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let rules = Arc::new(Mutex::new(Rules::default()));
        let (requests, faults, stop) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (r, q, f, s) = (Arc::clone(&rules), Arc::clone(&requests), Arc::clone(&faults), Arc::clone(&stop));
        std::thread::Builder::new().name("fault-proxy".into()).spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (r, q, f) = (Arc::clone(&r), Arc::clone(&q), Arc::clone(&f));
                std::thread::spawn(move || {
                    let _ = serve_one(conn, upstream, &r, &q, &f);
                });
            }
        })?;
        Ok(FaultProxy { addr, rules, requests, faults, stop })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next `n` requests get `fault`.
    pub fn fail_next(&self, n: usize, fault: Fault) {
        let mut r = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        r.next.extend(std::iter::repeat_n(fault, n));
    }

    /// Every request whose request line (`METHOD /path?query HTTP/1.1`) contains `pattern`
    /// gets `fault`, until [`clear`](Self::clear).
    pub fn fail_matching(&self, pattern: &str, fault: Fault) {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).matching.push((pattern.to_string(), fault, None));
    }

    /// The next `n` requests whose request line contains `pattern` get `fault`.
    pub fn fail_matching_n(&self, pattern: &str, fault: Fault, n: usize) {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).matching.push((pattern.to_string(), fault, Some(n)));
    }

    /// Removes every rule.
    pub fn clear(&self) {
        *self.rules.lock().unwrap_or_else(|p| p.into_inner()) = Rules::default();
    }

    /// Requests seen so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Requests answered with a fault so far.
    pub fn faults(&self) -> u64 {
        self.faults.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_one(
    mut client: TcpStream,
    upstream: SocketAddr,
    rules: &Mutex<Rules>,
    requests: &AtomicU64,
    faults: &AtomicU64,
) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    // Request head.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let line = text.lines().next().unwrap_or("").to_string();
    let length: usize = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    client.read_exact(&mut body)?;
    requests.fetch_add(1, Ordering::SeqCst);
    let fault = {
        let mut r = rules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = r.matching.iter().position(|(p, _, n)| line.contains(p.as_str()) && *n != Some(0)) {
            let rule = &mut r.matching[i];
            if let Some(n) = rule.2.as_mut() {
                *n -= 1;
            }
            Some(rule.1.clone())
        } else if !r.next.is_empty() {
            Some(r.next.remove(0))
        } else {
            None
        }
    };
    match fault {
        Some(Fault::Status(code)) => {
            faults.fetch_add(1, Ordering::SeqCst);
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>injected by the fault proxy</Message></Error>",
                if code >= 500 { "SlowDown" } else { "InvalidRequest" }
            );
            let resp = format!(
                "HTTP/1.1 {code} Injected\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
                xml.len()
            );
            client.write_all(resp.as_bytes())?;
            return Ok(());
        }
        Some(Fault::Stall(d)) => {
            faults.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(d);
            return Ok(());
        }
        Some(Fault::CorruptBody) => {
            faults.fetch_add(1, Ordering::SeqCst);
            if let Some(b) = body.get_mut(length / 2) {
                *b ^= 0x5a;
            }
        }
        None => {}
    }
    // Forward with Connection: close, then copy the response until the server closes.
    let mut up = TcpStream::connect(upstream)?;
    let mut new_head = String::new();
    for l in text.split("\r\n").filter(|l| !l.is_empty()) {
        if l.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        new_head.push_str(l);
        new_head.push_str("\r\n");
    }
    new_head.push_str("Connection: close\r\n\r\n");
    up.write_all(new_head.as_bytes())?;
    up.write_all(&body)?;
    std::io::copy(&mut up, &mut client)?;
    Ok(())
}
