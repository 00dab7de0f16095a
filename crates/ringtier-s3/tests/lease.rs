//! One writer per S3 prefix (issue 24): the lease object, against s3s-fs in-process and
//! moto_server (skipped with a message where it cannot start, unless
//! `RINGTIER_REQUIRE_MOTO=1`).
//!
//! The failure reported: two checkpoint stores on one prefix; the second, opening, aborted
//! the first's multipart uploads and deleted its parts as partial, and the first then wrote
//! a manifest over missing parts. Now the second open is refused with `Busy` while the first
//! holds its lease, a dead holder's lease is taken over once stale, and recovery touches only
//! uploads under its own prefix.
//!
//! Two writers in one process share its registry of held leases; to make the second one go
//! to the server as another process would, it reaches the same server by another name
//! (`localhost` instead of `127.0.0.1`), which the registry keys apart.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use ringtier_core::{AlignedBuf, ErrorKind, PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_s3::{S3Tier, MIN_PART_SIZE};
use ringtier_testkit::pattern;
use ringtier_testkit::s3::{forget_live_uploads, test_config, MotoServer, S3sFsServer, ACCESS_KEY, SECRET_KEY};

const PART: usize = MIN_PART_SIZE;
const BUCKET: &str = "ckpt";
/// The lock name of a store with prefix `ck`, hence its lease object's name.
const LEASE: &str = "run/.ringtier-lease-ckpt-ck";

/// A server on loopback: s3s-fs (with its root, to count uploads) or moto.
enum Server {
    S3s(S3sFsServer, tempfile::TempDir),
    Moto(MotoServer),
}

impl Server {
    fn endpoint(&self) -> String {
        match self {
            Server::S3s(s, _) => s.endpoint(),
            Server::Moto(m) => m.endpoint(),
        }
    }

    /// The same server by another name (another process's view, for the lease registry).
    fn alias(&self) -> String {
        self.endpoint().replace("127.0.0.1", "localhost")
    }

    fn name(&self) -> &'static str {
        match self {
            Server::S3s(..) => "s3s-fs",
            Server::Moto(_) => "moto",
        }
    }

    /// Multipart uploads under `prefix`, as (key, upload id).
    async fn uploads(&self, prefix: &str) -> Vec<(String, String)> {
        match self {
            // s3s-fs has no ListMultipartUploads, and its `.upload-ID.json` files do not name
            // the key: the tier's markers do (`PREFIX/.ringtier-uploads/*`: path, id); an
            // upload exists while its `.upload-ID.json` does.
            Server::S3s(_, dir) => {
                let markers = dir.path().join(BUCKET).join(prefix).join(".ringtier-uploads");
                let mut out: Vec<(String, String)> = std::fs::read_dir(markers)
                    .map(|d| d.filter_map(|e| e.ok()).collect::<Vec<_>>())
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|e| {
                        let text = std::fs::read_to_string(e.path()).ok()?;
                        let mut lines = text.lines();
                        let (path, id) = (lines.next()?.to_string(), lines.next()?.to_string());
                        let live = dir.path().join(format!(".upload-{id}.json")).exists();
                        (live && path.starts_with(&format!("{prefix}/"))).then_some((path, id))
                    })
                    .collect();
                out.sort();
                out
            }
            Server::Moto(_) => S3Tier::new(test_config(&self.endpoint(), BUCKET, prefix))
                .expect("tier")
                .list_multipart_uploads()
                .await
                .expect("list uploads")
                .expect("moto lists uploads"),
        }
    }
}

/// s3s-fs, and moto where it can start, each with the bucket.
async fn servers() -> Vec<Server> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut out = vec![Server::S3s(S3sFsServer::start(dir.path()).expect("s3s-fs"), dir)];
    match MotoServer::start() {
        Ok(m) => out.push(Server::Moto(m)),
        Err(e) if std::env::var("RINGTIER_REQUIRE_MOTO").is_ok_and(|v| v == "1") => panic!("moto_server: {e}"),
        Err(e) => eprintln!("moto skipped: moto_server cannot start ({e}); pip install 'moto[server]'"),
    }
    for s in &out {
        S3Tier::new(test_config(&s.endpoint(), BUCKET, "run")).expect("tier").create_bucket().await.expect("bucket");
    }
    out
}

fn raw(endpoint: &str) -> AmazonS3 {
    AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(BUCKET)
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .with_region("us-east-1")
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .build()
        .expect("object_store client")
}

async fn lease_body(endpoint: &str) -> Option<String> {
    match raw(endpoint).get(&Path::from(LEASE)).await {
        Ok(r) => Some(String::from_utf8_lossy(&r.bytes().await.expect("body")).into_owned()),
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => panic!("GET lease: {e}"),
    }
}

async fn s3_tier(endpoint: &str, prefix: &str, lease: Duration) -> Arc<dyn Tier> {
    let tier =
        S3Tier::new(test_config(endpoint, BUCKET, prefix).with_part_size(PART).with_lease_timeout(lease).named("s3"))
            .expect("s3 tier");
    Arc::new(tier)
}

fn fast(dir: &std::path::Path) -> Arc<dyn Tier> {
    Arc::new(PosixTier::new(PosixConfig::new(dir).with_name("fast".into())).expect("fast tier"))
}

fn cfg() -> StoreConfig {
    StoreConfig::default().with_prefix("ck".into()).with_keep_last(2).with_retries(0)
}

/// Starts a multipart upload of `key` with one part sent, and leaves it (a writer at work).
async fn start_upload(tier: &dyn Tier, key: &str) -> Box<dyn ringtier_core::ObjectWriter> {
    let mut w = tier.create(key).await.expect("create");
    let mut b = AlignedBuf::new(PART, 1).expect("buf");
    b.fill_from(&pattern(5, PART)).expect("fill");
    w.write_at(0, b).await.0.expect("a part sent");
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_store_on_the_prefix_is_refused_while_the_first_is_open() {
    for server in servers().await {
        let name = server.name();
        let (fast_a, fast_b) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
        let slow_a = s3_tier(&server.endpoint(), "run", Duration::from_secs(30)).await;
        let a = CheckpointStore::open(vec![fast(fast_a.path()), Arc::clone(&slow_a)], cfg()).await.expect("open A");
        let body = lease_body(&server.endpoint()).await.expect("A's lease object");
        assert!(body.contains(&format!("/{}/", std::process::id())), "{name}: {body}");
        assert!(slow_a.list("").await.expect("list").is_empty(), "{name}: the lease is not an object");

        // A is writing: a multipart upload under the prefix, parts sent.
        let key = "ck/00000000000000000001/parts/model";
        let w = start_upload(slow_a.as_ref(), key).await;
        assert_eq!(server.uploads("run").await.len(), 1, "{name}");

        // B, another writer on the same prefix: refused, and A's upload untouched.
        let slow_b = s3_tier(&server.alias(), "run", Duration::from_secs(30)).await;
        let e = CheckpointStore::open(vec![fast(fast_b.path()), Arc::clone(&slow_b)], cfg())
            .await
            .expect_err("a second store on the prefix");
        assert_eq!(e.kind(), ErrorKind::Busy, "{name}: {e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("pid {}", std::process::id())) && msg.contains("leased to"), "{name}: {msg}");
        assert_eq!(server.uploads("run").await.len(), 1, "{name}: B aborted A's upload");
        // A's upload completes whole: B's failed open deleted none of its parts.
        w.commit().await.expect("A commits");
        assert_eq!(slow_a.stat(key).await.expect("stat").size, PART as u64, "{name}");
        a.save(2, vec![Part::bytes("model", &pattern(6, 1000))]).await.expect("A saves");
        a.drain().await.expect("A drains");

        // A closes: its lease is deleted, and B opens.
        drop(a);
        let b = CheckpointStore::open(vec![fast(fast_b.path()), Arc::clone(&slow_b)], cfg()).await.expect("open B");
        assert_eq!(b.latest().await.expect("latest"), Some(2), "{name}");
        drop(b);
        for _ in 0..200 {
            if lease_body(&server.endpoint()).await.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(lease_body(&server.endpoint()).await, None, "{name}: the lease is deleted on close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_lease_is_taken_over_once_stale() {
    for server in servers().await {
        let name = server.name();
        let fast_dir = tempfile::tempdir().expect("tempdir");
        let slow = s3_tier(&server.endpoint(), "run", Duration::from_secs(2)).await;
        // A writer on another host died holding the prefix, with a 6 s timeout: long enough
        // that the open below still finds it fresh when this machine is loaded (with 2 s, a
        // slow server start under parallel tests made it stale before the first look).
        let dead =
            "ringtier-lease 1\nholder deadhost/4242/00000000feedface/0\nseq 7\ntimeout_ms 6000\nwritten_unix_ms 1\n";
        raw(&server.endpoint()).put(&Path::from(LEASE), PutPayload::from(dead)).await.expect("plant a lease");
        let e = CheckpointStore::open(vec![fast(fast_dir.path()), Arc::clone(&slow)], cfg())
            .await
            .expect_err("a fresh lease is live");
        assert_eq!(e.kind(), ErrorKind::Busy, "{name}: {e}");
        assert!(e.to_string().contains("host deadhost, pid 4242"), "{name}: {e}");
        // Stale once not renewed for its timeout, on the server's clock (to the second).
        tokio::time::sleep(Duration::from_millis(8200)).await;
        let store = CheckpointStore::open(vec![fast(fast_dir.path()), Arc::clone(&slow)], cfg())
            .await
            .expect("the stale lease is taken over");
        let body = lease_body(&server.endpoint()).await.expect("lease");
        assert!(body.contains(&format!("/{}/", std::process::id())) && !body.contains("deadhost"), "{name}: {body}");
        // Held, and renewed (every 0.5 s): still ours well past the timeout.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let later = lease_body(&server.endpoint()).await.expect("lease");
        assert!(later.contains(&format!("/{}/", std::process::id())), "{name}: {later}");
        assert_ne!(later, body, "{name}: the lease was not renewed");
        let e = ringtier_core::Tier::lock(&*s3_tier(&server.alias(), "run", Duration::from_secs(2)).await, "ckpt-ck")
            .await
            .expect_err("renewed, so live");
        assert_eq!(e.kind(), ErrorKind::Busy, "{name}: {e}");
        store.save(1, vec![Part::bytes("model", &pattern(8, 1000))]).await.expect("save");
        store.drain().await.expect("drain");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_racing_for_a_prefix_never_both_win() {
    for server in servers().await {
        let name = server.name();
        let t1 = s3_tier(&server.endpoint(), "run", Duration::from_secs(1)).await;
        let t2 = s3_tier(&server.alias(), "run", Duration::from_secs(1)).await;
        for round in 0..6 {
            if round % 2 == 1 {
                // A stale lease to take over: both contenders see the same ETag.
                let dead = "ringtier-lease 1\nholder deadhost/1/0/0\nseq 0\ntimeout_ms 1000\nwritten_unix_ms 1\n";
                raw(&server.endpoint()).put(&Path::from(LEASE), PutPayload::from(dead)).await.expect("plant");
                tokio::time::sleep(Duration::from_millis(2300)).await;
            }
            let (r1, r2) = tokio::join!(t1.lock("ckpt-ck"), t2.lock("ckpt-ck"));
            let won = [&r1, &r2].iter().filter(|r| matches!(r, Ok(Some(_)))).count();
            let busy = [&r1, &r2].iter().filter(|r| r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Busy)).count();
            assert_eq!((won, busy), (1, 1), "{name} round {round}: {r1:?} {r2:?}");
            drop((r1, r2));
            for _ in 0..200 {
                if lease_body(&server.endpoint()).await.is_none() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_aborts_only_uploads_under_its_own_prefix() {
    for server in servers().await {
        let name = server.name();
        let fast_dir = tempfile::tempdir().expect("tempdir");
        // Another tool's upload under another prefix of the bucket, and a killed writer's
        // under ours.
        let other = s3_tier(&server.endpoint(), "other", Duration::from_secs(30)).await;
        let mine = s3_tier(&server.endpoint(), "run", Duration::from_secs(30)).await;
        std::mem::forget(start_upload(other.as_ref(), "theirs").await);
        std::mem::forget(start_upload(mine.as_ref(), "ck/00000000000000000009/parts/x").await);
        forget_live_uploads();
        let theirs = server.uploads("other").await;
        assert_eq!((theirs.len(), server.uploads("run").await.len()), (1, 1), "{name}");
        // A marker under our prefix naming the other prefix's upload (planted, or written by
        // a confused tool): recovery never follows it outside the prefix.
        let (_, other_id) = &theirs[0];
        let hex: String = other_id.bytes().map(|b| format!("{b:02x}")).collect();
        let marker = format!("run/.ringtier-uploads/{hex}");
        raw(&server.endpoint())
            .put(&Path::from(marker.as_str()), PutPayload::from(format!("other/theirs\n{other_id}\n")))
            .await
            .expect("plant a marker");

        // An S3 tier without a prefix may not recover: it would abort every upload.
        let bare = s3_tier(&server.endpoint(), "", Duration::from_secs(30)).await;
        let e = CheckpointStore::open(vec![fast(fast_dir.path()), Arc::clone(&bare)], cfg())
            .await
            .expect_err("a store on a bucket's root");
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{name}: {e}");
        assert!(e.to_string().contains("no prefix"), "{name}: {e}");
        let e = S3Tier::new(test_config(&server.endpoint(), BUCKET, "")).expect("tier").recover_uploads().await;
        assert_eq!(e.expect_err("recover without a prefix").kind(), ErrorKind::InvalidInput);
        assert_eq!(server.uploads("other").await.len(), 1, "{name}");

        let store = CheckpointStore::open(vec![fast(fast_dir.path()), Arc::clone(&mine)], cfg()).await.expect("open");
        assert_eq!(server.uploads("run").await.len(), 0, "{name}: our killed writer's upload is aborted");
        assert_eq!(server.uploads("other").await, theirs, "{name}: the other prefix's upload survives");
        drop(store);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_servers_enforce_conditional_writes() {
    use object_store::{PutMode, PutOptions, UpdateVersion};
    for server in servers().await {
        let name = server.name();
        let store = Arc::new(raw(&server.endpoint()));
        let key = Path::from("cond/x");
        // Sixteen creates at once with If-None-Match: *: exactly one wins.
        let tries = (0..16).map(|i| {
            let (store, key) = (Arc::clone(&store), key.clone());
            tokio::spawn(async move {
                store.put_opts(&key, PutPayload::from(format!("writer {i}")), PutMode::Create.into()).await
            })
        });
        let mut won = Vec::new();
        for (i, t) in tries.enumerate() {
            match t.await.expect("task") {
                Ok(r) => won.push((i, r.e_tag)),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => panic!("{name}: create {i}: {e}"),
            }
        }
        assert_eq!(won.len(), 1, "{name}: {won:?}");
        let etag = won[0].1.clone();
        // If-Match: a stale ETag is refused, the current one accepted.
        let update = |e: Option<String>| PutOptions::from(PutMode::Update(UpdateVersion { e_tag: e, version: None }));
        let e = store.put_opts(&key, PutPayload::from("stale"), update(Some("\"0000\"".into()))).await;
        assert!(matches!(e, Err(object_store::Error::Precondition { .. })), "{name}: {e:?}");
        store.put_opts(&key, PutPayload::from("next"), update(etag)).await.expect("If-Match the current ETag");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_lease_was_taken_over_publishes_nothing() {
    for server in servers().await {
        let name = server.name();
        let slow = s3_tier(&server.endpoint(), "run", Duration::from_secs(2)).await;
        let lock = slow.lock("ckpt-ck").await.expect("lock").expect("a lease");
        let w = start_upload(slow.as_ref(), "ck/x").await;
        // Another writer takes the prefix over (as after a stall of this one past its
        // timeout): this one's next renewal is refused and it stops publishing.
        let other = "ringtier-lease 1\nholder elsewhere/7/0/0\nseq 0\ntimeout_ms 60000\nwritten_unix_ms 1\n";
        raw(&server.endpoint()).put(&Path::from(LEASE), PutPayload::from(other)).await.expect("take over");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let e = w.commit().await.expect_err("a commit after the lease was lost");
        assert_eq!(e.kind(), ErrorKind::Busy, "{name}: {e}");
        assert!(e.to_string().contains("host elsewhere, pid 7"), "{name}: {e}");
        assert_eq!(slow.stat("ck/x").await.expect_err("nothing published").kind(), ErrorKind::NotFound, "{name}");
        let e = slow.delete("ck/x").await.expect_err("no delete either");
        assert_eq!(e.kind(), ErrorKind::Busy, "{name}: {e}");
        assert_eq!(server.uploads("run").await.len(), 0, "{name}: the refused commit aborted its upload");
        drop(lock);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let body = lease_body(&server.endpoint()).await.expect("the new holder's lease is left alone");
        assert!(body.contains("elsewhere/7"), "{name}: {body}");
    }
}
