#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use ringtier_core::error::{Error, ErrorKind, Operation, Result};

use ringtier_core::catalog::{self, CATALOG};

/// Histogram buckets for every `_seconds` histogram: 10 µs to 10 s in 1-2.5-5 steps.
pub const LATENCY_BUCKETS: [f64; 19] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Where and how to serve `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExporterConfig {
    /// Address to listen on. Default `127.0.0.1:9464`.
    pub addr: SocketAddr,
    /// Allow an address that is not loopback (serving to the network). Default false.
    pub allow_remote: bool,
}

impl ExporterConfig {
    /// Sets [`ExporterConfig::addr`].
    pub fn with_addr(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// Sets [`ExporterConfig::allow_remote`].
    pub fn with_allow_remote(mut self, allow_remote: bool) -> Self {
        self.allow_remote = allow_remote;
        self
    }
}

impl Default for ExporterConfig {
    fn default() -> Self {
        Self::loopback(9464)
    }
}

impl ExporterConfig {
    /// Loopback on `port`.
    pub fn loopback(port: u16) -> Self {
        ExporterConfig { addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port), allow_remote: false }
    }
}

/// The installed exporter: a handle to render the exposition and the address served.
#[derive(Debug, Clone)]
pub struct MetricsExporter {
    handle: PrometheusHandle,
    addr: SocketAddr,
}

impl MetricsExporter {
    /// The exposition text, as a scrape would return it.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

static INSTALLED: OnceLock<MetricsExporter> = OnceLock::new();

fn setup_err(msg: String) -> Error {
    Error::new(ErrorKind::InvalidInput, msg).with_operation(Operation::Setup)
}

/// A builder with ringtier's buckets.
pub fn builder() -> Result<PrometheusBuilder> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
        .map_err(|e| setup_err(format!("metric buckets: {e}")))
}

/// Checks the address (loopback unless `allow_remote`) and that it can be bound, without
/// installing anything: the errors a command should give before its workload starts.
pub fn check(config: &ExporterConfig) -> Result<()> {
    if !config.addr.ip().is_loopback() && !config.allow_remote {
        return Err(setup_err(format!(
            "metrics address {} is not a loopback address; serving metrics to the network needs the explicit \
             allow-remote flag (--metrics-allow-remote)",
            config.addr
        )));
    }
    TcpListener::bind(config.addr).map(drop).map_err(|e| {
        Error::from(e)
            .with_operation(Operation::Setup)
            .with_key(config.addr.to_string())
            .set_kind(ErrorKind::InvalidInput)
    })
}

/// Installs the Prometheus recorder globally and serves `/metrics` on `config.addr` from a
/// background thread. Describes every catalog metric (HELP and TYPE lines). Call once, before
/// building tiers; a second call returns the first exporter if the address is the same.
///
/// Port 0 serves on a free port, which [`MetricsExporter::addr`] reports (the port is chosen
/// by binding it once just before the exporter binds it again).
pub fn install(config: &ExporterConfig) -> Result<MetricsExporter> {
    if let Some(e) = INSTALLED.get() {
        if e.addr == config.addr || config.addr.port() == 0 && e.addr.ip() == config.addr.ip() {
            return Ok(e.clone());
        }
        return Err(setup_err(format!("a metrics exporter is already installed on {}", e.addr)));
    }
    check(config)?;
    let mut config = *config;
    if config.addr.port() == 0 {
        let probe = TcpListener::bind(config.addr)
            .map_err(|e| Error::from(e).with_operation(Operation::Setup).with_key(config.addr.to_string()))?;
        config.addr = probe.local_addr().map_err(|e| Error::from(e).with_operation(Operation::Setup))?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("ringtier-metrics")
        .build()
        .map_err(|e| Error::from(e).with_operation(Operation::Setup))?;
    // The listener binds inside build(), which needs the runtime's context.
    let (recorder, exporter) = {
        let _guard = runtime.enter();
        builder()?.with_http_listener(config.addr).build().map_err(|e| setup_err(format!("metrics exporter: {e}")))?
    };
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|_| setup_err("another metrics recorder is already installed".to_string()))?;
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("ringtier-metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_secs(5));
                    loop {
                        tick.tick().await;
                        upkeep.run_upkeep();
                    }
                });
                if let Err(e) = exporter.await {
                    tracing::error!("metrics exporter stopped: {e:?}");
                }
            })
        })
        .map_err(|e| Error::from(e).with_operation(Operation::Setup))?;
    describe_all();
    let exporter = MetricsExporter { handle, addr: config.addr };
    let _ = INSTALLED.set(exporter.clone());
    Ok(exporter)
}

/// Registers help text and units of every catalog metric with the installed recorder.
pub fn describe_all() {
    for m in CATALOG {
        let unit = unit_of(m.name);
        match m.kind {
            "counter" => match unit {
                Some(u) => metrics::describe_counter!(m.name, u, m.help),
                None => metrics::describe_counter!(m.name, m.help),
            },
            "gauge" => match unit {
                Some(u) => metrics::describe_gauge!(m.name, u, m.help),
                None => metrics::describe_gauge!(m.name, m.help),
            },
            _ => match unit {
                Some(u) => metrics::describe_histogram!(m.name, u, m.help),
                None => metrics::describe_histogram!(m.name, m.help),
            },
        }
    }
}

fn unit_of(name: &str) -> Option<metrics::Unit> {
    if name.ends_with("_seconds") || name.ends_with("_seconds_total") {
        Some(metrics::Unit::Seconds)
    } else if name.ends_with("_bytes") || name.ends_with("_bytes_total") {
        Some(metrics::Unit::Bytes)
    } else {
        None
    }
}

/// The catalog as the Markdown of `docs/METRICS.md`.
pub fn catalog_markdown() -> String {
    let mut s = String::from(
        "# Metrics\n\n\
         Every metric ringtier emits. Generated from the catalog (`ringtier-core/src/catalog.rs`) by\n\
         `ringtier metrics catalog`; a test fails when this file and the code differ.\n\n\
         Label values are bounded: `tier` is a tier's name (one per tier the process opened: by\n\
         default what and where it is, `uring:ROOT` or `posix:ROOT`, so a fast and a slow directory\n\
         are told apart; set `name` for a shorter label, as the CLI does with `fast`, `slow`,\n\
         `dataset`), `op` and `result` come from fixed sets; no key, file name or step is ever a label.\n\
         Latency histograms have buckets from 10 µs to 10 s.\n\n\
         | name | type | labels | help |\n|---|---|---|---|\n",
    );
    for m in CATALOG {
        s.push_str(&format!("| `{}` | {} | {} | {} |\n", m.name, m.kind, m.labels.join(", "), m.help));
    }
    s.push_str(&format!(
        "\nValues of `op`: {}. Values of `result`: {}.\n",
        catalog::OPS.iter().map(|o| format!("`{o}`")).collect::<Vec<_>>().join(", "),
        catalog::RESULTS.iter().map(|o| format!("`{o}`")).collect::<Vec<_>>().join(", ")
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_units_and_types_are_known() {
        for m in CATALOG {
            assert!(m.name.starts_with("ringtier_"), "{}", m.name);
            assert!(["counter", "gauge", "histogram"].contains(&m.kind), "{}", m.name);
            if m.kind == "counter" {
                assert!(m.name.ends_with("_total"), "counters end in _total: {}", m.name);
            }
            assert!(!m.labels.contains(&"key") && !m.labels.contains(&"file"), "{}", m.name);
        }
        assert!(LATENCY_BUCKETS[0] <= 1e-5 && *LATENCY_BUCKETS.last().unwrap_or(&0.0) >= 10.0);
    }

    #[test]
    fn non_loopback_needs_the_flag_and_a_busy_port_is_an_error() {
        let remote = ExporterConfig { addr: "0.0.0.0:0".parse().expect("addr"), allow_remote: false };
        let err = check(&remote).expect_err("not loopback");
        assert!(err.to_string().contains("--metrics-allow-remote"), "{err}");
        assert!(check(&ExporterConfig { allow_remote: true, ..remote }).is_ok());
        let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
        let cfg = ExporterConfig::loopback(busy.local_addr().expect("addr").port());
        let err = check(&cfg).expect_err("port in use");
        assert_eq!(err.os_code(), Some(libc_eaddrinuse()), "{err}");
        assert!(err.to_string().contains(&cfg.addr.to_string()), "{err}");
    }

    fn libc_eaddrinuse() -> i32 {
        98
    }
}
