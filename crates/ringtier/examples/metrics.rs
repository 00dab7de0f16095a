//! Serves Prometheus metrics while reading files through a metered io_uring tier, scrapes its
//! own `/metrics` once and prints the tier's series.
//!
//! ```text
//! cargo run -p ringtier --example metrics                         # a free loopback port
//! cargo run -p ringtier --example metrics -- PORT [LINGER_SECONDS]  # then: curl 127.0.0.1:PORT/metrics
//! ```

use std::error::Error;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use ringtier::layers::Metered;
use ringtier::metrics::{self, ExporterConfig};
use ringtier::{ops, Tier, UringConfig, UringTier};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    // Port 0 (the default) serves on a free port; the exporter reports which.
    let port = args.next().map(|p| p.parse::<u16>()).transpose()?.unwrap_or(0);
    let linger: f64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(0.0);

    // First the exporter, then the tiers: their metric handles bind to it when they are built.
    let exporter = metrics::install(&ExporterConfig::loopback(port))?;
    println!("serving http://{}/metrics", exporter.addr());

    let tmp = tempfile::tempdir()?;
    for i in 0..100 {
        std::fs::write(tmp.path().join(format!("{i:03}.jpg")), vec![i as u8; 10_000])?;
    }
    let tier = Metered::new(Arc::new(UringTier::new(tmp.path(), UringConfig::default())?));
    for f in tier.list("").await? {
        ops::get(&tier, &f.key).await?;
    }

    // What Prometheus would see.
    let mut http = std::net::TcpStream::connect(exporter.addr())?;
    http.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut page = String::new();
    http.read_to_string(&mut page)?;
    for line in page.lines().filter(|l| l.starts_with("ringtier_tier_") && !l.ends_with(" 0")) {
        if !line.contains("_bucket{") {
            println!("{line}");
        }
    }
    if linger > 0.0 {
        println!("serving for {linger} s more");
        tokio::time::sleep(Duration::from_secs_f64(linger)).await;
    }
    Ok(())
}
