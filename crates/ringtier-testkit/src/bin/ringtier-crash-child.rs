//! `ringtier-crash-child --fast DIR --slow DIR [--size BYTES] [--start STEP] [--count N]
//! [--slow-bytes-per-sec N]`: saves checkpoints until killed, printing `saved STEP` after each
//! save returns (see `ringtier_testkit::crash_child`). The SIGKILL test's child process.

use std::path::PathBuf;
use std::process::ExitCode;

use ringtier_testkit::crash_child;

struct Args {
    fast: PathBuf,
    slow: PathBuf,
    size: usize,
    start: u64,
    count: u64,
    slow_bytes_per_sec: u64,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        fast: PathBuf::new(),
        slow: PathBuf::new(),
        size: 200_000,
        start: 1,
        count: 1000,
        slow_bytes_per_sec: 30 << 20,
    };
    let mut it = std::env::args_os().skip(1);
    while let Some(flag) = it.next() {
        let flag = flag.to_string_lossy().into_owned();
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.to_string_lossy().parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--fast" => a.fast = value.into(),
            "--slow" => a.slow = value.into(),
            "--size" => a.size = number()? as usize,
            "--start" => a.start = number()?,
            "--count" => a.count = number()?,
            "--slow-bytes-per-sec" => a.slow_bytes_per_sec = number()?,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if a.fast.as_os_str().is_empty() || a.slow.as_os_str().is_empty() {
        return Err("--fast DIR and --slow DIR are needed".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ringtier-crash-child: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringtier-crash-child: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let res = rt.block_on(async {
        let store = crash_child::open_store(&args.fast, &args.slow, args.slow_bytes_per_sec).await?;
        crash_child::save_until_killed(&store, args.start, args.count, args.size).await
    });
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringtier-crash-child: {e}");
            ExitCode::FAILURE
        }
    }
}
