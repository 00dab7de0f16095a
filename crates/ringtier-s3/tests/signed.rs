//! The requests the tier signs itself (checksummed uploads, the lease, bucket creation,
//! ListMultipartUploads) all go through one HTTP client per tier, built once and reused, so
//! its connections are pooled: against s3s-fs in-process and moto_server (skipped with a
//! message where it cannot start, unless `RINGTIER_REQUIRE_MOTO=1`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_s3::{S3Tier, MIN_PART_SIZE};
use ringtier_testkit::pattern;
use ringtier_testkit::s3::{test_config, MotoServer, S3sFsServer, ACCESS_KEY, SECRET_KEY};

const PART: usize = MIN_PART_SIZE;
const BUCKET: &str = "ckpt";
const PARTS: usize = 4;

/// A TCP forwarder on loopback that counts the connections made through it.
struct ConnectionCounter {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl ConnectionCounter {
    fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 64 << 10];
                        while let Ok(n @ 1..) = from.read(&mut buf) {
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Write);
                    });
                };
                pipe(client.try_clone().expect("clone"), server.try_clone().expect("clone"));
                pipe(server, client);
            }
        });
        ConnectionCounter { addr, accepted }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A server on loopback (s3s-fs with the directory it serves).
enum Server {
    S3s { server: S3sFsServer, _root: tempfile::TempDir },
    Moto(MotoServer),
}

impl Server {
    fn endpoint(&self) -> String {
        match self {
            Server::S3s { server, .. } => server.endpoint(),
            Server::Moto(m) => m.endpoint(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Server::S3s { .. } => "s3s-fs",
            Server::Moto(_) => "moto",
        }
    }
}

/// s3s-fs, and moto where it can start.
fn servers() -> Vec<Server> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut out = vec![Server::S3s { server: S3sFsServer::start(dir.path()).expect("s3s-fs"), _root: dir }];
    match MotoServer::start() {
        Ok(m) => out.push(Server::Moto(m)),
        Err(e) if std::env::var("RINGTIER_REQUIRE_MOTO").is_ok_and(|v| v == "1") => panic!("moto_server: {e}"),
        Err(e) => eprintln!("moto skipped: moto_server cannot start ({e}); pip install 'moto[server]'"),
    }
    out
}

/// The `seq` of the lease object at `endpoint` (renewals so far).
async fn lease_seq(endpoint: &str, key: &str) -> u64 {
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(BUCKET)
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .with_region("us-east-1")
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .build()
        .expect("object_store client");
    let body = store.get(&Path::from(key)).await.expect("the lease").bytes().await.expect("its body");
    let body = String::from_utf8_lossy(&body).into_owned();
    body.lines().find_map(|l| l.strip_prefix("seq ")).and_then(|s| s.parse().ok()).expect("a seq line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_http_client_signs_every_request_of_a_tier() {
    for server in servers() {
        let name = server.name();
        let upstream: SocketAddr = server.endpoint().trim_start_matches("http://").parse().expect("address");
        let counter = ConnectionCounter::start(upstream);
        // One part in flight at a time: with its connections pooled, the tier needs a few
        // connections however many requests it sends.
        let cfg = test_config(&counter.endpoint(), BUCKET, "one-client")
            .with_part_size(PART)
            .with_upload_concurrency(1)
            .with_lease_timeout(Duration::from_secs(1))
            .named("s3");
        let tier = S3Tier::new(cfg).expect("s3 tier");
        assert_eq!(tier.signed_clients_built(), 1, "{name}: one client, built with the tier");
        tier.create_bucket().await.expect("bucket (a signed request)");

        // Open takes the lease (conditional create, recovery: ListMultipartUploads where the
        // server has it); the drain sends a checksummed multipart upload of PARTS parts (the
        // probe of the server's part checks, create, parts, completion), renewing meanwhile.
        let fast_dir = tempfile::tempdir().expect("tempdir");
        let fast: Arc<dyn Tier> =
            Arc::new(PosixTier::new(PosixConfig::new(fast_dir.path()).with_name("fast".into())).expect("fast tier"));
        let slow: Arc<dyn Tier> = Arc::new(tier.clone());
        let store_cfg = StoreConfig::default().with_prefix("ck".into()).with_keep_last(2).with_retries(0);
        let store = CheckpointStore::open(vec![fast, slow], store_cfg).await.expect("open");
        let data = pattern(11, PARTS * PART - 1000);
        store.save(1, vec![Part::bytes("model", &data)]).await.expect("save");
        store.drain().await.expect("drain");
        let meta = tier.stat("ck/00000000000000000001/parts/model").await;
        assert_eq!(meta.map(|m| m.size).ok(), Some(data.len() as u64), "{name}: drained whole");
        // The lease is renewed every quarter of its timeout: wait for a few renewals.
        let lease = "one-client/.ringtier-lease-ckpt-ck";
        let before = lease_seq(&server.endpoint(), lease).await;
        tokio::time::sleep(Duration::from_millis(900)).await;
        let after = lease_seq(&server.endpoint(), lease).await;
        assert!(after >= before + 2, "{name}: the lease renewed ({before} then {after})");

        assert_eq!(tier.signed_clients_built(), 1, "{name}: a request built its own HTTP client");
        // At least PARTS + 2 (create, completion) + 2 (probe) + 3 (lease) + 1 (bucket) signed
        // requests, and object_store's own: a client per request would open a connection for
        // each. s3s-fs keeps connections alive (HTTP/1.1); moto's server may not.
        let connections = counter.connections();
        eprintln!("{name}: {connections} connections");
        if matches!(server, Server::S3s { .. }) {
            assert!(connections <= 6, "{name}: {connections} connections: the tier's connections are not reused");
        }
        drop(store);
    }
}
