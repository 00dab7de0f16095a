//! An exporter installed on port 0 serves on a free port and says which.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use ringtier_metrics::{install, ExporterConfig};

#[test]
fn port_zero_serves_on_the_port_it_reports() {
    let exporter = install(&ExporterConfig::loopback(0)).expect("install");
    let addr = exporter.addr();
    assert_ne!(addr.port(), 0, "the real port is reported");
    metrics::counter!(ringtier_core::catalog::URING_SUBMITS_TOTAL, "tier" => "t").increment(3);
    // The listener comes up on the exporter's thread: retry briefly.
    let mut body = String::new();
    for _ in 0..100 {
        if let Ok(mut s) = TcpStream::connect(addr) {
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
            s.read_to_string(&mut body).expect("response");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(body.starts_with("HTTP/1.") && body.contains("ringtier_"), "{body}");
    // Asking again for port 0 gives the same exporter.
    assert_eq!(install(&ExporterConfig::loopback(0)).expect("again").addr(), addr);
}
