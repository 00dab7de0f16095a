//! The power-cut layer: what a machine's storage keeps and loses when the power goes out.
//!
//! # The durability model
//!
//! [`PowerCutTier`] wraps any [`Tier`] (the tests use the memory tier) and keeps, for every key
//! changed through it, the *durable* state of that key apart from what the running process
//! sees, the way TigerBeetle's and FoundationDB's storage simulators separate the disk from the
//! page cache. The model is the [`Tier`] contract, operation by operation (the file tiers'
//! fsyncs and renames below it are checked from their syscalls elsewhere):
//!
//! * **Staged data is volatile.** Bytes written to an [`ObjectWriter`] that was never
//!   committed are gone after a cut (nothing was visible under the key anyway).
//! * **An acknowledged `commit` or `delete` is durable** under [`Durability::Synced`] (a file
//!   tier: data fsync, rename, directory fsync before `commit` returns; `delete` fsyncs the
//!   directory). Under [`Durability::Volatile`] (tmpfs, memory) nothing changed through the
//!   layer survives a cut: the tier comes back as it was when it was attached. Under
//!   [`Durability::Unsynced`] (a tier that acknowledges before its data is durable: a missing
//!   fsync, a disk cache that lies) each key comes back in any one of the states it had
//!   since the last reboot, chosen by the seed, key by key: the mode that shows a test can
//!   catch lost acknowledged data.
//! * **An operation in progress when the cut comes** (it started and had not returned: the
//!   one a countdown cut interrupts, those running on other tasks, a commit whose future was
//!   dropped) happened or did not, chosen by the seed when the machine reboots. Each
//!   `commit` or `delete` is atomic per key: a key is never half replaced.
//! * **After the cut the machine is down**: every operation in progress or started later
//!   fails with `EIO` (an [`ErrorKind::Io`] error that is not
//!   temporary), so the process that was running sees the crash as errors and is never
//!   acknowledged anything the cut may have lost.
//! * **Reboot** ([`PowerCut::reboot`]) waits until no operation is inside the wrapped tier,
//!   decides every uncertain operation from the seed, and rewrites the wrapped tier to the
//!   durable state. Tier handles opened before the reboot belong to the dead process and keep
//!   failing; [`PowerCutTier::reopen`] hands the new process a working one over the same disk.
//!
//! A cut comes from [`PowerCut::cut`] (now) or [`PowerCut::cut_after`] (during the n-th
//! mutating operation from now: `create`, `write_at`, `commit` or `delete`), so a test can cut
//! at every step of a save, a drain or an eviction. Several tiers attached to one
//! [`PowerCut`] share a power supply: one machine with two disks loses power at once.
//!
//! Outside the model: partial (torn) writes inside one object (a commit is atomic, and staged
//! data is lost whole), reordering below the [`Tier`] API, and a wrapped tier that keeps
//! changing an object after the future that asked for it was dropped.

use ringtier_core::rng::SplitMix64;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::Notify;

use ringtier_core::layers::LayeredTier;
use ringtier_core::listing::{ListOptions, Listing};
use ringtier_core::ops;
use ringtier_core::tier::read_one_at_a_time;
use ringtier_core::{
    Adopted, AlignedBuf, Capabilities, Error, ErrorKind, ObjectMeta, ObjectReader, ObjectWriter, Operation, ReadBatch,
    Result, Space, Tier, TierLock,
};

/// What survives a power cut on a [`PowerCutTier`] (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The [`Tier`] contract of a durable tier: an acknowledged `commit` or `delete` survives;
    /// one in progress at the cut survives or not (seeded).
    Synced,
    /// Nothing changed through the layer survives a cut (tmpfs, memory): the tier comes back
    /// as it was when it was attached. Reported as not durable.
    Volatile,
    /// Acknowledged changes may be lost: each changed key comes back in any one of its states
    /// since the last reboot (seeded). A lying tier, to show that tests catch lost data.
    /// Reported as durable (that is the lie).
    Unsynced,
}

/// What a [`PowerCut::reboot`] decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RebootReport {
    /// Uncertain changes (in progress at the cut, or unsynced) that survived.
    pub kept: u64,
    /// Uncertain changes that were lost.
    pub lost: u64,
    /// Keys of the wrapped tiers rewritten to their durable state.
    pub restored_keys: u64,
}

/// Counters of a [`PowerCut`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerCutStats {
    /// Mutating operations (`create`, `write_at`, `commit`, `delete`) started, every boot.
    pub mutations: u64,
    /// Cuts so far.
    pub cuts: u64,
    /// Reboots so far.
    pub reboots: u64,
    /// Uncertain changes kept by reboots, summed.
    pub kept: u64,
    /// Uncertain changes lost by reboots, summed.
    pub lost: u64,
}

/// The state of a key: its bytes, or absent.
type Content = Option<Arc<[u8]>>;

struct Disk {
    inner: Arc<dyn Tier>,
    durability: Durability,
    /// Durable state of every key changed through the layer since the last reboot (for
    /// `Volatile`: since it was attached). Keys not here are durable as the inner tier has them.
    durable: BTreeMap<String, Content>,
    /// Changes whose survival the next reboot decides, by key, oldest first.
    uncertain: BTreeMap<String, Vec<Content>>,
}

struct State {
    boot: u64,
    down: bool,
    /// Mutating operations left before the cut; the one that takes it to zero is cut.
    countdown: Option<u64>,
    rng: SplitMix64,
    in_flight: usize,
    disks: Vec<Disk>,
    stats: PowerCutStats,
    /// The operation the last countdown cut came during: (operation, key, tier).
    last_cut: Option<(Operation, String, String)>,
}

impl State {
    fn next_u64(&mut self) -> u64 {
        // Every choice of a schedule comes from here.
        self.rng.next_u64()
    }

    fn cut(&mut self) {
        if !self.down {
            self.down = true;
            self.countdown = None;
            self.stats.cuts += 1;
        }
    }

    /// Counts a mutating operation; true when the cut comes during it.
    fn tick(&mut self) -> bool {
        self.stats.mutations += 1;
        match self.countdown {
            Some(n) if n <= 1 => {
                self.cut();
                true
            }
            Some(n) => {
                self.countdown = Some(n - 1);
                false
            }
            None => false,
        }
    }
}

struct Domain {
    state: Mutex<State>,
    idle: Notify,
}

impl Domain {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn down_error(op: Operation, key: &str, tier: &str) -> Error {
    Error::from_errno(libc::EIO, "power cut (simulated): the machine is down until it reboots").context(op, key, tier)
}

/// A power supply shared by the [`PowerCutTier`]s attached to it: cut it, then reboot.
/// Cheap to clone; every clone controls the same supply.
#[derive(Clone)]
pub struct PowerCut {
    domain: Arc<Domain>,
}

impl fmt::Debug for PowerCut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.domain.lock();
        f.debug_struct("PowerCut")
            .field("boot", &st.boot)
            .field("down", &st.down)
            .field("countdown", &st.countdown)
            .field("stats", &st.stats)
            .finish()
    }
}

impl PowerCut {
    /// A supply whose every choice (what an interrupted operation did) comes from `seed`.
    pub fn new(seed: u64) -> Self {
        let state = State {
            boot: 0,
            down: false,
            countdown: None,
            rng: SplitMix64::new(seed),
            in_flight: 0,
            disks: Vec::new(),
            stats: PowerCutStats::default(),
            last_cut: None,
        };
        PowerCut { domain: Arc::new(Domain { state: Mutex::new(state), idle: Notify::new() }) }
    }

    /// Attaches `inner` as one more disk of this machine. Its current contents are taken as
    /// durable.
    pub fn attach(&self, inner: Arc<dyn Tier>, durability: Durability) -> PowerCutTier {
        let mut st = self.domain.lock();
        let name = inner.name().to_string();
        st.disks.push(Disk {
            inner: Arc::clone(&inner),
            durability,
            durable: BTreeMap::new(),
            uncertain: BTreeMap::new(),
        });
        PowerCutTier { domain: Arc::clone(&self.domain), disk: st.disks.len() - 1, boot: st.boot, inner, name }
    }

    /// Cuts the power now. Idempotent while the machine is down.
    pub fn cut(&self) {
        self.domain.lock().cut();
    }

    /// Cuts the power during the `n`-th mutating operation (`create`, `write_at`, `commit`,
    /// `delete`) from now on any attached tier; `n == 0` cuts now. That operation fails, and
    /// whether its change happened is decided at the reboot. Replaces an earlier countdown.
    pub fn cut_after(&self, n: u64) {
        let mut st = self.domain.lock();
        if n == 0 {
            st.cut();
        } else if !st.down {
            st.countdown = Some(n);
        }
    }

    /// Drops a countdown set by [`PowerCut::cut_after`] that has not fired.
    pub fn disarm(&self) {
        self.domain.lock().countdown = None;
    }

    /// True while the power is out (after a cut, before the reboot).
    pub fn is_down(&self) -> bool {
        self.domain.lock().down
    }

    /// The operation the last countdown cut ([`PowerCut::cut_after`]) came during, as
    /// (operation, key, tier name); `None` when none fired since the last reboot.
    pub fn last_cut(&self) -> Option<(Operation, String, String)> {
        self.domain.lock().last_cut.clone()
    }

    /// Counters so far.
    pub fn stats(&self) -> PowerCutStats {
        self.domain.lock().stats
    }

    /// Restores power: cuts first if the power is on, waits until no operation is inside a
    /// wrapped tier, decides every uncertain change from the seed, and rewrites the wrapped
    /// tiers to their durable state. Handles opened before it keep failing; get new ones
    /// with [`PowerCutTier::reopen`].
    pub async fn reboot(&self) -> Result<RebootReport> {
        self.cut();
        loop {
            let idle = self.domain.idle.notified();
            if self.domain.lock().in_flight == 0 {
                break;
            }
            idle.await;
        }
        let mut report = RebootReport::default();
        let mut plan: Vec<(Arc<dyn Tier>, String, Content)> = Vec::new();
        {
            let mut guard = self.domain.lock();
            let st = &mut *guard;
            for d in 0..st.disks.len() {
                let uncertain = std::mem::take(&mut st.disks[d].uncertain);
                let volatile = st.disks[d].durability == Durability::Volatile;
                for (key, candidates) in uncertain {
                    if volatile {
                        // Nothing survives on a volatile tier, certain or not.
                        report.lost += 1;
                        continue;
                    }
                    // 0: the key keeps its durable state; i > 0: the i-th uncertain change
                    // (oldest first) is what survived.
                    let pick = (st.next_u64() % (candidates.len() as u64 + 1)) as usize;
                    if pick == 0 {
                        report.lost += 1;
                    } else {
                        report.kept += 1;
                        st.disks[d].durable.insert(key, candidates[pick - 1].clone());
                    }
                }
                let disk = &mut st.disks[d];
                let durable = if disk.durability == Durability::Volatile {
                    disk.durable.clone()
                } else {
                    // From now on the inner tier holds the durable state of every key.
                    std::mem::take(&mut disk.durable)
                };
                for (key, content) in durable {
                    plan.push((Arc::clone(&disk.inner), key, content));
                }
            }
            st.stats.kept += report.kept;
            st.stats.lost += report.lost;
        }
        for (tier, key, content) in plan {
            if restore(tier.as_ref(), &key, content.as_deref()).await? {
                report.restored_keys += 1;
            }
        }
        let mut st = self.domain.lock();
        st.boot += 1;
        st.down = false;
        st.last_cut = None;
        st.countdown = None;
        st.stats.reboots += 1;
        Ok(report)
    }
}

/// Puts `key` of `tier` in state `content` (absent for `None`); true when that changed it.
async fn restore(tier: &dyn Tier, key: &str, content: Option<&[u8]>) -> Result<bool> {
    let current = match ops::get(tier, key).await {
        Ok(data) => Some(data),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    match (content, current) {
        (Some(want), Some(have)) if want == have.as_slice() => Ok(false),
        (Some(want), _) => ops::put(tier, key, want, ops::DEFAULT_CHUNK).await.map(|_| true),
        (None, None) => Ok(false),
        (None, Some(_)) => match tier.delete(key).await {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
            _ => Ok(true),
        },
    }
}

/// A tier that loses what a real machine would lose in a power cut (see the
/// [module docs](self) for the exact model). Made by [`PowerCut::attach`] or
/// [`PowerCutTier::new`].
pub struct PowerCutTier {
    domain: Arc<Domain>,
    disk: usize,
    /// The boot this handle belongs to: it works only until the next reboot.
    boot: u64,
    inner: Arc<dyn Tier>,
    name: String,
}

impl fmt::Debug for PowerCutTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowerCutTier").field("inner", &self.inner).field("boot", &self.boot).finish()
    }
}

/// An operation inside the wrapped tier: counted so that a reboot waits for it, and, when it
/// changes a key, left uncertain if the machine goes down before it returns (or its future is
/// dropped).
struct InFlight<'a> {
    tier: &'a PowerCutTier,
    change: Option<(String, Content)>,
    done: bool,
}

impl<'a> InFlight<'a> {
    fn start(tier: &'a PowerCutTier, op: Operation, key: &str) -> Result<Self> {
        let mut st = tier.domain.lock();
        if st.down || st.boot != tier.boot {
            return Err(down_error(op, key, &tier.name));
        }
        st.in_flight += 1;
        Ok(InFlight { tier, change: None, done: false })
    }

    /// Ends the operation: its result stands if the machine stayed up; otherwise it becomes an
    /// error, and a change the wrapped tier made becomes uncertain (a change it refused never
    /// happened).
    fn finish<T>(mut self, op: Operation, key: &str, res: Result<T>) -> Result<T> {
        self.done = true;
        let change = self.change.take();
        let mut st = self.tier.domain.lock();
        st.in_flight -= 1;
        let up = !st.down && st.boot == self.tier.boot;
        let disk = &mut st.disks[self.tier.disk];
        let out = match (res, change) {
            (Ok(_), Some((k, c))) if !up => {
                disk.uncertain.entry(k).or_default().push(c);
                Err(down_error(op, key, &self.tier.name))
            }
            (_, _) if !up => Err(down_error(op, key, &self.tier.name)),
            (Ok(v), Some((k, c))) => {
                match disk.durability {
                    Durability::Synced => {
                        disk.uncertain.remove(&k);
                        disk.durable.insert(k, c);
                    }
                    Durability::Volatile => {}
                    Durability::Unsynced => disk.uncertain.entry(k).or_default().push(c),
                }
                Ok(v)
            }
            (res, _) => res,
        };
        drop(st);
        self.tier.domain.idle.notify_waiters();
        out
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Dropped mid-operation (a cancelled future): the change may or may not have happened.
        let mut st = self.tier.domain.lock();
        st.in_flight -= 1;
        if let Some((k, c)) = self.change.take() {
            st.disks[self.tier.disk].uncertain.entry(k).or_default().push(c);
        }
        drop(st);
        self.tier.domain.idle.notify_waiters();
    }
}

impl PowerCutTier {
    /// Wraps `inner` in a machine of its own (seeded by `seed`); [`PowerCutTier::power`] is
    /// its switch.
    pub fn new(inner: Arc<dyn Tier>, durability: Durability, seed: u64) -> Self {
        PowerCut::new(seed).attach(inner, durability)
    }

    /// The power supply of this tier's machine.
    pub fn power(&self) -> PowerCut {
        PowerCut { domain: Arc::clone(&self.domain) }
    }

    /// This disk as a process started after the last reboot sees it: a handle that works
    /// until the next reboot. (Handles from before a reboot keep failing.)
    pub fn reopen(&self) -> PowerCutTier {
        let boot = self.domain.lock().boot;
        PowerCutTier {
            domain: Arc::clone(&self.domain),
            disk: self.disk,
            boot,
            inner: Arc::clone(&self.inner),
            name: self.name.clone(),
        }
    }

    /// The wrapped tier (what is there now, durable or not).
    pub fn inner(&self) -> &Arc<dyn Tier> {
        &self.inner
    }

    /// The durability this tier was attached with.
    pub fn durability(&self) -> Durability {
        self.domain.lock().disks[self.disk].durability
    }

    fn check_up(&self, op: Operation, key: &str) -> Result<()> {
        let st = self.domain.lock();
        if st.down || st.boot != self.boot {
            return Err(down_error(op, key, &self.name));
        }
        Ok(())
    }

    /// Counts a mutating operation that changes no key (`create`, `write_at`) and fails it
    /// when the power is out or goes out during it.
    fn tick(&self, op: Operation, key: &str) -> Result<()> {
        let mut st = self.domain.lock();
        if st.down || st.boot != self.boot {
            return Err(down_error(op, key, &self.name));
        }
        if st.tick() {
            st.last_cut = Some((op, key.to_string(), self.name.clone()));
            return Err(down_error(op, key, &self.name));
        }
        Ok(())
    }

    /// Starts a change of `key` to `content` (a commit, or a delete for `None`): records the
    /// key's durable state before its first change since the last reboot (read from the
    /// wrapped tier), counts the operation, and fails it when the power is out or goes out
    /// during it (the change is then uncertain).
    async fn begin_change(&self, op: Operation, key: &str, content: Content) -> Result<InFlight<'_>> {
        let mut flight = InFlight::start(self, op, key)?;
        let known = self.domain.lock().disks[self.disk].durable.contains_key(key);
        let snapshot: Option<Content> = if known {
            None
        } else {
            match ops::get(self.inner.as_ref(), key).await {
                Ok(data) => Some(Some(data.into())),
                Err(e) if e.kind() == ErrorKind::NotFound => Some(None),
                Err(e) => return Err(e.context(op, key, &self.name)),
            }
        };
        let mut st = self.domain.lock();
        if st.down || st.boot != self.boot {
            return Err(down_error(op, key, &self.name));
        }
        if let Some(before) = snapshot {
            // The first snapshot wins: it was read before any change of the key through the
            // layer (each change takes its snapshot before it reaches the wrapped tier).
            st.disks[self.disk].durable.entry(key.to_string()).or_insert(before);
        }
        if st.tick() {
            st.last_cut = Some((op, key.to_string(), self.name.clone()));
            st.disks[self.disk].uncertain.entry(key.to_string()).or_default().push(content);
            return Err(down_error(op, key, &self.name));
        }
        flight.change = Some((key.to_string(), content));
        Ok(flight)
    }
}

#[async_trait]
impl LayeredTier for PowerCutTier {
    fn inner(&self) -> &dyn Tier {
        self.inner.as_ref()
    }

    fn capabilities(&self) -> Capabilities {
        let durable = self.durability() != Durability::Volatile;
        Capabilities { durable, native_batch: false, ..self.inner.capabilities() }
    }

    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        let op = InFlight::start(self, Operation::Stat, key)?;
        let res = self.inner.stat(key).await;
        op.finish(Operation::Stat, key, res)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let op = InFlight::start(self, Operation::List, prefix)?;
        let res = self.inner.list(prefix).await;
        op.finish(Operation::List, prefix, res)
    }

    async fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        let op = InFlight::start(self, Operation::List, prefix)?;
        let res = self.inner.list_with(prefix, options).await;
        op.finish(Operation::List, prefix, res)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let op = self.begin_change(Operation::Delete, key, None).await?;
        let res = self.inner.delete(key).await;
        op.finish(Operation::Delete, key, res)
    }

    async fn lock(&self, name: &str) -> Result<Option<TierLock>> {
        self.check_up(Operation::Open, name)?;
        self.inner.lock(name).await
    }

    /// Changes no key's content: not a point the power can go out at (as `lock`).
    async fn remove_empty_dirs(&self, prefix: &str) -> Result<()> {
        self.check_up(Operation::Delete, prefix)?;
        self.inner.remove_empty_dirs(prefix).await
    }

    async fn space(&self) -> Result<Option<Space>> {
        let op = InFlight::start(self, Operation::Stat, "")?;
        let res = self.inner.space().await;
        op.finish(Operation::Stat, "", res)
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        let op = match InFlight::start(self, Operation::Read, key) {
            Ok(op) => op,
            Err(e) => return (Err(e), buf),
        };
        let (res, buf) = self.inner.read_at(key, offset, len, buf).await;
        (op.finish(Operation::Read, key, res), buf)
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        self.tick(Operation::Create, key)?;
        let op = InFlight::start(self, Operation::Create, key)?;
        let res = self.inner.create(key).await;
        let inner = op.finish(Operation::Create, key, res)?;
        let tier = PowerCutTier {
            domain: Arc::clone(&self.domain),
            disk: self.disk,
            boot: self.boot,
            inner: Arc::clone(&self.inner),
            name: self.name.clone(),
        };
        Ok(Box::new(PowerCutWriter { tier, inner, shadow: Vec::new() }))
    }

    /// Adopts through the wrapped tier as two changes of the model, `from` gone and `key`
    /// holding its bytes: each counted (a cut may come during either), durable once this
    /// returns, uncertain if the power goes out first. A rename is atomic on a real file
    /// system; the model is weaker (a cut may keep one change without the other), which only
    /// widens what the tests check. Declined by the wrapped tier: nothing changed.
    async fn adopt(&self, from: &str, key: &str) -> Result<Option<Adopted>> {
        self.check_up(Operation::Commit, from)?;
        let data =
            ops::get(self.inner.as_ref(), from).await.map_err(|e| e.context(Operation::Commit, from, &self.name))?;
        let mut gone = self.begin_change(Operation::Commit, from, None).await?;
        let mut here = self.begin_change(Operation::Commit, key, Some(Arc::from(data))).await?;
        let res = self.inner.adopt(from, key).await;
        if matches!(res, Ok(None)) {
            gone.change = None;
            here.change = None;
        }
        // A refused adoption changed nothing: both changes are dropped with its error.
        let outcome = if res.is_ok() { Ok(()) } else { Err(Error::new(ErrorKind::Io, "adoption refused")) };
        let moved = gone.finish(Operation::Commit, from, outcome);
        let adopted = here.finish(Operation::Commit, key, res)?;
        moved?;
        Ok(adopted)
    }

    /// Reads by key, so that each fails once the power is out.
    async fn open_read(&self, key: &str) -> Result<Option<Arc<dyn ObjectReader>>> {
        let _ = key;
        Ok(None)
    }

    /// Each request through [`LayeredTier::read_at`], so that each fails once the power is out.
    async fn read_batch(&self, batch: ReadBatch) -> ReadBatch {
        read_one_at_a_time(self, batch).await
    }
}

/// A staged object on a [`PowerCutTier`]: its bytes are kept (a shadow copy) so that the
/// layer knows the state a commit makes durable.
struct PowerCutWriter {
    tier: PowerCutTier,
    inner: Box<dyn ObjectWriter>,
    shadow: Vec<u8>,
}

impl fmt::Debug for PowerCutWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowerCutWriter").field("inner", &self.inner).field("len", &self.shadow.len()).finish()
    }
}

#[async_trait]
impl ObjectWriter for PowerCutWriter {
    fn key(&self) -> &str {
        self.inner.key()
    }

    async fn write_at(&mut self, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        let key = self.inner.key().to_string();
        let op = match self
            .tier
            .tick(Operation::Write, &key)
            .and_then(|()| InFlight::start(&self.tier, Operation::Write, &key))
        {
            Ok(op) => op,
            Err(e) => return (Err(e), buf),
        };
        let (res, buf) = self.inner.write_at(offset, buf).await;
        let res = op.finish(Operation::Write, &key, res);
        if res.is_ok() {
            let src = buf.as_slice();
            let (start, end) = (offset as usize, offset as usize + src.len());
            if self.shadow.len() < end {
                self.shadow.resize(end, 0);
            }
            self.shadow[start..end].copy_from_slice(src);
        }
        (res, buf)
    }

    async fn commit(self: Box<Self>) -> Result<ObjectMeta> {
        let PowerCutWriter { tier, inner, shadow } = *self;
        let key = inner.key().to_string();
        let op = tier.begin_change(Operation::Commit, &key, Some(Arc::from(shadow))).await?;
        let res = inner.commit().await;
        op.finish(Operation::Commit, &key, res)
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        let key = self.inner.key().to_string();
        let op = InFlight::start(&self.tier, Operation::Abort, &key)?;
        let res = self.inner.abort().await;
        op.finish(Operation::Abort, &key, res)
    }
}
