//! [`MotoServer`]: `moto_server` (Python `moto[server]`) as a child process.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

fn wait_for_port(port: u16, child: &mut Child, timeout: Duration) -> std::io::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(std::io::Error::other(format!("moto_server exited at start: {status}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "moto_server did not listen in time"))
}

/// A `moto_server` (Python `moto[server]`) child process on `127.0.0.1`. Killed when dropped.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    port: u16,
}

impl MotoServer {
    /// Starts `moto_server` (from `$PATH`, or `python3 -m moto.server`) on a free port.
    pub fn start() -> std::io::Result<Self> {
        let port = free_port()?;
        let spawn = |cmd: &mut Command| cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let mut child = match spawn(Command::new("moto_server").args(["-H", "127.0.0.1", "-p", &port.to_string()])) {
            Ok(c) => c,
            Err(_) => {
                spawn(Command::new("python3").args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()]))?
            }
        };
        if let Err(e) = wait_for_port(port, &mut child, Duration::from_secs(60)) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(MotoServer { child, port })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
