//! A real Prometheus scrapes a running ringtier workload: the byte counters it stores grow by
//! exactly what the workload read, and `promtool check metrics` accepts the exposition.
//!
//! Needs the `prometheus` and `promtool` binaries (Debian package `prometheus`; `.ci/run`
//! installs it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    if !resp.starts_with("HTTP/1.1 200") && !resp.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(format!("GET {path}: {}", resp.lines().next().unwrap_or(""))));
    }
    Ok(resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn which(bin: &str) -> String {
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| std::path::Path::new(d).join(bin))
        .find(|p| p.is_file());
    match found {
        Some(p) => p.display().to_string(),
        None => panic!("{bin} is not installed: apt-get install -y prometheus (bash .ci/run does)"),
    }
}

/// The value of a PromQL instant query returning one sample.
fn query(port: u16, promql: &str) -> Option<f64> {
    let enc: String = promql
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"_-.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let body = http_get(port, &format!("/api/v1/query?query={enc}")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_what_the_workload_read() {
    let prometheus = which("prometheus");
    let promtool = which("promtool");
    let dir = tempfile::Builder::new().prefix("prom").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let ds = dir.path().join("ds");
    let gen = Command::new(env!("CARGO_BIN_EXE_ringtier"))
        .args(["gen", "--preset", "caltech101", "--files", "300", "--classes", "3", "--dir"])
        .arg(&ds)
        .output()
        .expect("gen");
    assert!(gen.status.success());
    let manifest = std::fs::read_to_string(ds.join(".ringtier-manifest.tsv")).expect("manifest");
    let total: u64 = manifest
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split('\t').nth(1)?.parse::<u64>().ok())
        .sum();

    let (mport, pport) = (free_port(), free_port());
    let mut workload = Kill(
        Command::new(env!("CARGO_BIN_EXE_ringtier"))
            .args(["bench", "read", "--engines", "uring-direct", "--concurrency", "4", "--repeats", "3", "--dir"])
            .arg(&ds)
            .args(["--metrics-addr", &format!("127.0.0.1:{mport}"), "--metrics-linger", "60"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the workload"),
    );
    let stderr = workload.0.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });

    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ringtier\n    \
             static_configs:\n      - targets: ['127.0.0.1:{mport}']\n"
        ),
    )
    .expect("config");
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let _prom = Kill(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{pport}"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );

    // The workload finishes its reads, then lingers serving metrics.
    let mut seen = Vec::new();
    wait_for("the workload to finish", Duration::from_secs(120), || {
        while let Ok(line) = rx.try_recv() {
            seen.push(line);
        }
        assert!(!seen.iter().any(|l| l.starts_with("Error")), "workload failed: {seen:?}");
        seen.iter().any(|l| l.contains("serving metrics for")).then_some(())
    });

    // Prometheus stores exactly the bytes read: three passes over the dataset.
    let want = 3.0 * total as f64;
    let promql = r#"sum(ringtier_tier_bytes_total{tier="uring-direct",op="read"})"#;
    let got = wait_for("Prometheus to scrape the final counters", Duration::from_secs(60), || {
        query(pport, promql).filter(|v| *v == want)
    });
    assert_eq!(got, want);
    let files = query(pport, r#"sum(ringtier_tier_operations_total{tier="uring-direct",op="read",result="ok"})"#);
    assert_eq!(files, Some(900.0), "three passes of 300 files");
    assert!(query(pport, "count(ringtier_tier_operation_duration_seconds_bucket)").is_some_and(|n| n > 10.0));
    assert!(query(pport, "count(ringtier_uring_in_flight)").is_some());

    // The exposition passes promtool's checks.
    let exposition = http_get(mport, "/metrics").expect("scrape");
    assert!(exposition.contains("# HELP ringtier_tier_bytes_total"), "described metrics");
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    check.stdin.take().expect("stdin").write_all(exposition.as_bytes()).expect("write");
    let out = check.wait_with_output().expect("promtool output");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_bad_metrics_address_fails_before_the_workload() {
    let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = busy.local_addr().expect("addr").port();
    for (addr, want) in [
        (format!("127.0.0.1:{port}"), "Address already in use"),
        ("0.0.0.0:0".to_string(), "--metrics-allow-remote"),
        ("192.0.2.1:9464".to_string(), "not a loopback address"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ringtier"))
            .args(["gen", "--dir", "/nonexistent/should-not-be-created", "--metrics-addr", &addr])
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{addr}: {err}");
        assert!(!err.contains("should-not-be-created"), "fails before the workload: {err}");
    }
    // With the explicit flag, an address that cannot be bound is still a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_ringtier"))
        .args(["metrics", "catalog", "--metrics-addr", "192.0.2.1:9464", "--metrics-allow-remote"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("192.0.2.1:9464"));
}
