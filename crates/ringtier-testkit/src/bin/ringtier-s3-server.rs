//! `ringtier-s3-server --root DIR [--port N] [--latency-ms MS] [--ignore-part-checksums]
//! [--access-key KEY --secret-key SECRET]`: the test kit's s3s-fs server (S3 over `DIR`, with
//! AWS's checks of part checksums and conditional writes; `ringtier_testkit::s3::S3sFsServer`)
//! on `127.0.0.1:N` (0, the default: any free port). Prints its endpoint
//! (`http://127.0.0.1:PORT`) on the first line of stdout once it listens, then serves until it
//! is killed or its stdin closes (so it never outlives the process that started it with a
//! pipe; started with stdin on `/dev/null`, it stops at once). The S3 benchmarks run it: they
//! link no S3 server themselves.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ringtier_testkit::s3::{S3sFsServer, ACCESS_KEY, SECRET_KEY};

struct Args {
    root: PathBuf,
    port: u16,
    latency_ms: f64,
    part_checksums: bool,
    access_key: String,
    secret_key: String,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        root: PathBuf::new(),
        port: 0,
        latency_ms: 0.0,
        part_checksums: true,
        access_key: ACCESS_KEY.to_string(),
        secret_key: SECRET_KEY.to_string(),
    };
    let mut it = std::env::args_os().skip(1);
    while let Some(flag) = it.next() {
        let flag = flag.to_string_lossy().into_owned();
        if flag == "--ignore-part-checksums" {
            a.part_checksums = false;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let text = value.to_string_lossy().into_owned();
        match flag.as_str() {
            "--root" => a.root = value.into(),
            "--port" => a.port = text.parse().map_err(|e| format!("--port {text}: {e}"))?,
            "--latency-ms" => a.latency_ms = text.parse().map_err(|e| format!("--latency-ms {text}: {e}"))?,
            "--access-key" => a.access_key = text,
            "--secret-key" => a.secret_key = text,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if a.root.as_os_str().is_empty() {
        return Err("--root DIR is needed (buckets are its subdirectories)".into());
    }
    if !(a.latency_ms.is_finite() && a.latency_ms >= 0.0) {
        return Err(format!("--latency-ms {} is not a duration", a.latency_ms));
    }
    Ok(a)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ringtier-s3-server: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&a.root) {
        eprintln!("ringtier-s3-server: creating {}: {e}", a.root.display());
        return ExitCode::FAILURE;
    }
    let latency = Duration::from_secs_f64(a.latency_ms / 1000.0);
    let server = match S3sFsServer::start_with_credentials(
        &a.root,
        a.port,
        latency,
        a.part_checksums,
        (&a.access_key, &a.secret_key),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringtier-s3-server: starting on port {}: {e}", a.port);
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    if writeln!(out, "{}", server.endpoint()).and_then(|()| out.flush()).is_err() {
        return ExitCode::FAILURE;
    }
    // Serve until stdin closes (or the process is killed): what is read is ignored.
    let mut sink = [0u8; 256];
    let mut stdin = std::io::stdin();
    loop {
        match stdin.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    drop(server);
    ExitCode::SUCCESS
}
