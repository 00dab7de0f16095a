//! The driver's side of a batch read: each request's state machine (statx, the direct-I/O
//! decision, open, read with short reads and EAGAIN continued, close), one step per completion.

use super::*;

impl Driver {
    /// Starts the next idle entry of a batch; entries needing no I/O finish on the spot.
    pub(in crate::driver) fn start_next_entry(&mut self, id: u32, b: &mut BatchJob) -> bool {
        while b.next < b.states.len() {
            let i = b.next;
            b.next += 1;
            if !matches!(b.states[i].phase, Phase::Idle { .. }) {
                continue;
            }
            b.active += 1;
            b.states[i].started = Some(Instant::now());
            let file = match &b.target {
                Target::File { file, direct, align, size, .. } => {
                    let opened = file.fixed().map_or(Opened::Fd(file.fd()), Opened::Fixed);
                    Some((opened, *direct, *align, *size))
                }
                Target::Keys { .. } => None,
            };
            match (b.target.root_fd(), file) {
                (Some(root_fd), _) if self.try_fast_open(b, i) => self.submit_open(id, b, i, root_fd, true),
                (Some(root_fd), _) => {
                    let st = &mut b.states[i];
                    st.phase = Phase::Statx;
                    let path = b.paths[st.path..].as_ptr().cast::<libc::c_char>();
                    let sqe = opcode::Statx::new(types::Fd(root_fd), path, (&mut st.statx as *mut libc::statx).cast())
                        .flags(0)
                        .mask(libc::STATX_TYPE | libc::STATX_SIZE | libc::STATX_DIOALIGN)
                        .build()
                        .user_data(((id as u64) << 32) | i as u64);
                    // SAFETY: path and statx point into the boxed job, owned by the driver
                    // until this completion is reaped.
                    unsafe { self.push_raw(&sqe) };
                    self.in_flight += 1;
                }
                (None, Some((file, direct, align, size))) => {
                    // The job's target keeps the file open (and its slot registered) until
                    // the job ends.
                    b.states[i].phase = Phase::Read { file, guessed: false };
                    match self.plan_read(b, i, size, direct, align) {
                        Ok(true) => self.submit_read(id, b, i),
                        Ok(false) => self.entry_done(b, i),
                        Err(e) => {
                            let e = b.err(i, e);
                            b.states[i].result = Some(Err(e));
                            self.entry_done(b, i);
                        }
                    }
                }
                (None, None) => self.entry_done(b, i),
            }
            return true;
        }
        false
    }

    /// Reads skip statx when the policy is off or the root's direct-I/O alignment is known and
    /// the buffer fits it: open, read, close (a file read in pieces, every piece). The kernel
    /// has the last word: EINVAL on open or read sends the file through the statx path, and so
    /// does a piece that finds no byte at its offset (statx then tells a range that starts at
    /// the end, which is empty, from one that starts past it, which is an error).
    fn try_fast_open(&self, b: &mut BatchJob, i: usize) -> bool {
        let (offset, len) = match b.batch.get(i) {
            Some((_, e)) => (e.offset(), e.len()),
            None => return false,
        };
        if len == 0 || matches!(b.states[i].phase, Phase::Idle { statx_only: true }) {
            return false;
        }
        let (direct, align) = match (self.shared.policy, self.shared.root_align) {
            (DirectIoPolicy::Off, _) => (false, 1),
            (_, None) => return false,
            (_, Some((mem, off))) => {
                let Some(buf) = b.states[i].buf.as_ref() else { return false };
                let align = mem.max(off);
                let fits = (buf.as_ptr() as u64) % mem == 0 && direct_span(offset, len, align).1 <= buf.capacity();
                if !fits {
                    return false; // statx path: it decides and reports fallbacks or errors
                }
                (true, align)
            }
        };
        matches!(self.plan_read(b, i, SIZE_UNKNOWN, direct, align), Ok(true))
    }

    /// Sends an entry back through the statx path (after its descriptor is closed).
    fn restart_slow(&mut self, id: u32, b: &mut BatchJob, i: usize) {
        let st = &mut b.states[i];
        st.filled = 0;
        st.phase = Phase::Idle { statx_only: true };
        b.next = b.next.min(i);
        b.active -= 1;
        self.requeue(id);
    }

    /// Works out the span to read. Returns false when no read is needed (empty range).
    fn plan_read(&self, b: &mut BatchJob, i: usize, size: u64, direct: bool, align: u64) -> Result<bool> {
        let (offset, len) = {
            let (_, entries) = b.batch.parts_mut();
            (entries[i].offset(), entries[i].len())
        };
        let st = &mut b.states[i];
        if offset > size {
            return Err(Error::new(ErrorKind::OutOfRange, format!("offset {offset} is past the end ({size} bytes)")));
        }
        let want = len.min((size - offset) as usize);
        st.want = want;
        let Some(buf) = st.buf.as_mut() else {
            return Err(Error::new(ErrorKind::InvalidInput, "request has no buffer"));
        };
        if want == 0 {
            buf.clear();
            st.result = Some(Ok(0));
            return Ok(false);
        }
        st.direct = direct;
        st.align = align.max(1);
        if direct {
            let (io_off, span, head) = direct_span(offset, want, st.align);
            if span > buf.capacity() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "buffer of {} bytes is too small for the {span}-byte aligned span of this read",
                        buf.capacity()
                    ),
                ));
            }
            st.io_off = io_off;
            st.span = span;
            st.head = head;
        } else {
            if want > buf.capacity() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("buffer of {} bytes is too small for a {want}-byte read", buf.capacity()),
                ));
            }
            st.io_off = offset;
            st.span = want;
            st.head = 0;
        }
        st.size = size;
        st.filled = 0;
        st.high = 0;
        Ok(true)
    }

    /// Decides O_DIRECT for one file from its statx DIO alignment and the request's buffer.
    fn decide_direct(&self, b: &BatchJob, i: usize, mem: u64, off: u64, size: u64) -> Result<(bool, u64)> {
        let policy = self.shared.policy;
        if policy == DirectIoPolicy::Off {
            return Ok((false, 1));
        }
        let key = b.batch.get(i).map(|(k, _)| k).unwrap_or("");
        if mem == 0 || off == 0 {
            if policy == DirectIoPolicy::Required {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "direct I/O is required but {key:?} on {} does not support it (statx reports no DIO alignment)",
                        self.shared.fs_type
                    ),
                ));
            }
            self.shared.count_fallback("the filesystem reports no direct-I/O alignment");
            return Ok((false, 1));
        }
        let st = &b.states[i];
        let Some(buf) = st.buf.as_ref() else {
            return Ok((false, 1));
        };
        let (offset, len) = b.batch.get(i).map(|(_, e)| (e.offset(), e.len())).unwrap_or((0, 0));
        let want = len.min(size.saturating_sub(offset) as usize);
        let align = off.max(mem);
        let (_, span, _) = direct_span(offset.min(size), want.max(1), align);
        let addr_ok = (buf.as_ptr() as u64) % mem == 0;
        let fits = span <= buf.capacity();
        if addr_ok && fits {
            return Ok((true, align));
        }
        let why = if addr_ok { "buffer too small for the aligned span" } else { "buffer address not aligned" };
        if policy == DirectIoPolicy::Required {
            return Err(Error::new(
                ErrorKind::Misaligned,
                format!(
                    "direct I/O is required but {key:?} on {} needs {mem}-byte aligned memory and a buffer of at \
                     least {span} bytes ({why})",
                    self.shared.fs_type
                ),
            ));
        }
        self.shared.count_fallback(why);
        Ok((false, 1))
    }

    /// Submits the next read of an entry in its read phase.
    fn submit_read(&mut self, id: u32, b: &mut BatchJob, i: usize) {
        let st = &mut b.states[i];
        let Phase::Read { file, .. } = st.phase else {
            let e = b.err(i, Error::new(ErrorKind::InvalidInput, "read submitted outside the read phase"));
            b.states[i].result = Some(Err(e));
            return self.entry_done(b, i);
        };
        let Some(buf) = st.buf.as_mut() else {
            // Cannot happen (entries without a buffer never start); if it does, the entry
            // fails instead of waiting for a completion that will never come.
            let e = b.err(i, Error::new(ErrorKind::InvalidInput, "request has no buffer"));
            return self.end_read(id, b, i, Err(e));
        };
        // SAFETY: filled < span <= capacity, so the pointer stays inside the buffer.
        let ptr = unsafe { buf.as_mut_ptr().add(st.filled) };
        let mut len = st.span - st.filled;
        let cap = if self.max_read > 0 { (self.max_read as u64).min(MAX_IO_BYTES) } else { MAX_IO_BYTES };
        if len as u64 > cap {
            // One read asks for at most `cap` bytes, kept a multiple of the direct-I/O
            // alignment; the rest follows as with a short read.
            len = (align_down(cap, st.align) as usize).max(st.align as usize).min(len);
        }
        st.last_len = len;
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        let off = st.io_off + st.filled as u64;
        let fixed_buf = match (buf.pool_slot(), self.registered_pool) {
            (Some((pool, idx)), Some(reg)) if pool == reg && idx <= u16::MAX as u32 => Some(idx as u16),
            _ => None,
        };
        let user_data = ((id as u64) << 32) | i as u64;
        let sqe = match (fixed_buf, file) {
            (Some(bi), Opened::Fixed(slot)) => {
                opcode::ReadFixed::new(types::Fixed(slot), ptr, len, bi).offset(off).build()
            }
            (Some(bi), Opened::Fd(fd)) => opcode::ReadFixed::new(types::Fd(fd), ptr, len, bi).offset(off).build(),
            (None, Opened::Fixed(slot)) => opcode::Read::new(types::Fixed(slot), ptr, len).offset(off).build(),
            (None, Opened::Fd(fd)) => opcode::Read::new(types::Fd(fd), ptr, len).offset(off).build(),
        }
        .user_data(user_data);
        if st.filled == 0 {
            let s = &self.shared.stats;
            if st.direct { &s.reads_direct } else { &s.reads_buffered }.fetch_add(1, Ordering::Relaxed);
            if fixed_buf.is_some() {
                s.fixed_buffer_reads.fetch_add(1, Ordering::Relaxed);
            }
            if matches!(file, Opened::Fixed(_)) {
                s.fixed_file_reads.fetch_add(1, Ordering::Relaxed);
            }
        }
        // SAFETY: the buffer is owned by the boxed job until this completion is reaped; the
        // file is this request's own (closed only after its reads) or the target's, which the
        // job keeps open; a fixed-buffer index is used only for buffers of the pool registered
        // with this ring.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
    }

    /// Opens an entry's file beneath the root; `guessed`: on the root's alignment guess.
    fn submit_open(&mut self, id: u32, b: &mut BatchJob, i: usize, root_fd: RawFd, guessed: bool) {
        let st = &mut b.states[i];
        st.phase = Phase::Open { guessed };
        // Direct descriptors have no file-table entry, so O_CLOEXEC is meaningless there
        // (and the kernel refuses it).
        let mut flags = if self.direct_files { libc::O_RDONLY } else { libc::O_RDONLY | libc::O_CLOEXEC };
        if st.direct {
            flags |= libc::O_DIRECT;
        }
        // Beneath the root, unless the root follows links (a read-only dataset root).
        let resolve = match &b.target {
            Target::Keys { root } => root.resolve_flags(),
            Target::File { .. } => libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
        };
        let st = &mut b.states[i];
        st.how = types::OpenHow::new().flags(flags as u64).resolve(resolve);
        let path = b.paths[st.path..].as_ptr().cast::<libc::c_char>();
        let mut op = opcode::OpenAt2::new(types::Fd(root_fd), path, &st.how);
        if self.direct_files {
            op = op.file_index(Some(types::DestinationSlot::auto_target()));
        }
        let sqe = op.build().user_data(((id as u64) << 32) | i as u64);
        // SAFETY: path and how point into the boxed job, owned until the completion is reaped;
        // the job's target keeps the root open.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
    }

    /// Closes the file an entry opened; `then_statx`: restart it through `statx` after.
    fn submit_close(&mut self, id: u32, b: &mut BatchJob, i: usize, file: Opened, then_statx: bool) {
        b.states[i].phase = Phase::Close { then_statx };
        let sqe = match file {
            Opened::Fixed(slot) => opcode::Close::new(types::Fixed(slot)).build(),
            Opened::Fd(fd) => opcode::Close::new(types::Fd(fd)).build(),
        }
        .user_data(((id as u64) << 32) | i as u64);
        // SAFETY: close takes no pointers.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
    }

    /// Ends an entry's read with `res`: closes its file first when the entry opened one.
    fn end_read(&mut self, id: u32, b: &mut BatchJob, i: usize, res: Result<usize>) {
        b.states[i].result = Some(res);
        b.states[i].mark_latency();
        match (&b.target, b.states[i].phase) {
            (Target::Keys { .. }, Phase::Read { file, .. }) => self.submit_close(id, b, i, file, false),
            _ => self.entry_done(b, i),
        }
    }

    /// Closes a descriptor (or direct descriptor) that a fail point pretends was never opened.
    #[cfg(feature = "fail-points")]
    fn close_now(&mut self, res: i32) {
        if self.direct_files {
            let _ = self.ring.submitter().register_files_update(res as u32, &[-1]);
        } else {
            // SAFETY: res is the descriptor the kernel just opened for this request; nothing
            // else knows its number.
            unsafe { libc::close(res) };
        }
    }

    fn entry_done(&mut self, b: &mut BatchJob, i: usize) {
        b.states[i].mark_latency();
        b.states[i].phase = Phase::Done;
        b.active -= 1;
    }

    /// Handles one completion of request `i` of a batch, by the request's phase.
    pub(in crate::driver) fn on_batch_cqe(&mut self, id: u32, b: &mut BatchJob, i: usize, res: i32) {
        let phase = b.states[i].phase;
        #[cfg(feature = "fail-points")]
        let res = match phase {
            Phase::Statx => self.inject(FailOp::Statx, res),
            Phase::Open { .. } => {
                let injected = self.inject(FailOp::Open, res);
                if injected < 0 && res >= 0 {
                    // The kernel did open the file: close it before pretending it did not.
                    self.close_now(res);
                }
                injected
            }
            Phase::Read { .. } => self.inject(FailOp::Read, res),
            Phase::Close { .. } => self.inject(FailOp::Close, res),
            Phase::Idle { .. } | Phase::Done => res,
        };
        match phase {
            Phase::Statx => {
                if res < 0 {
                    if is_retryable(-res) && b.states[i].retries < MAX_RETRIES {
                        b.states[i].retries += 1;
                        b.states[i].phase = Phase::Idle { statx_only: true };
                        b.next = b.next.min(i);
                        b.active -= 1;
                        self.requeue(id);
                        return;
                    }
                    let e = b.err(i, Error::from_errno(-res, "statx failed"));
                    b.states[i].result = Some(Err(e));
                    return self.entry_done(b, i);
                }
                let Some(root_fd) = b.target.root_fd() else {
                    return self.entry_done(b, i);
                };
                let stx = &b.states[i].statx;
                if u32::from(stx.stx_mode) & libc::S_IFMT != libc::S_IFREG {
                    let e = b.err(i, Error::new(ErrorKind::NotFound, "not a regular file"));
                    b.states[i].result = Some(Err(e));
                    return self.entry_done(b, i);
                }
                let size = stx.stx_size;
                let (mem, off) = if stx.stx_mask & libc::STATX_DIOALIGN != 0 {
                    (stx.stx_dio_mem_align as u64, stx.stx_dio_offset_align as u64)
                } else {
                    (0, 0)
                };
                let decision = self.decide_direct(b, i, mem, off, size);
                match decision {
                    Err(e) => {
                        let e = b.err(i, e);
                        b.states[i].result = Some(Err(e));
                        self.entry_done(b, i)
                    }
                    Ok((direct, align)) => match self.plan_read(b, i, size, direct, align) {
                        Ok(true) => self.submit_open(id, b, i, root_fd, false),
                        Ok(false) => self.entry_done(b, i),
                        Err(e) => {
                            let e = b.err(i, e);
                            b.states[i].result = Some(Err(e));
                            self.entry_done(b, i)
                        }
                    },
                }
            }
            Phase::Open { guessed } => {
                let Some(root_fd) = b.target.root_fd() else {
                    return self.entry_done(b, i);
                };
                if res < 0 {
                    let errno = -res;
                    if is_retryable(errno) && b.states[i].retries < MAX_RETRIES {
                        b.states[i].retries += 1;
                        return self.submit_open(id, b, i, root_fd, guessed);
                    }
                    if errno == libc::EINVAL && guessed {
                        // The guess from the root probe was wrong for this file: ask statx.
                        return self.restart_slow(id, b, i);
                    }
                    if errno == libc::EINVAL && b.states[i].direct && self.shared.policy == DirectIoPolicy::Auto {
                        // The filesystem refused O_DIRECT at open: read buffered.
                        self.shared.count_fallback("open with O_DIRECT returned EINVAL");
                        let size = b.states[i].statx.stx_size;
                        if let Err(e) = self.plan_read(b, i, size, false, 1) {
                            let e = b.err(i, e);
                            b.states[i].result = Some(Err(e));
                            return self.entry_done(b, i);
                        }
                        return self.submit_open(id, b, i, root_fd, false);
                    }
                    let msg = if errno == libc::EXDEV { "path leads outside the tier root" } else { "open failed" };
                    let e = match &b.target {
                        // A link inside a root that does not follow links: named.
                        Target::Keys { root } if errno == libc::ELOOP && !root.follows_links() => {
                            let key = b.batch.get(i).map(|(k, _)| k).unwrap_or("");
                            root.explain_eloop(key, std::io::Error::from_raw_os_error(errno))
                        }
                        _ => Error::from_errno(errno, msg),
                    };
                    let e = b.err(i, e);
                    b.states[i].result = Some(Err(e));
                    return self.entry_done(b, i);
                }
                let file = if self.direct_files { Opened::Fixed(res as u32) } else { Opened::Fd(res) };
                b.states[i].phase = Phase::Read { file, guessed };
                self.submit_read(id, b, i)
            }
            Phase::Read { file, guessed } => {
                let st = &mut b.states[i];
                if res < 0 {
                    let errno = -res;
                    if is_retryable(errno) && st.retries < MAX_RETRIES {
                        st.retries += 1;
                        self.shared.stats.resubmits.fetch_add(1, Ordering::Relaxed);
                        return self.submit_read(id, b, i);
                    }
                    if errno == libc::EINVAL && guessed && st.direct {
                        // This file's direct-I/O alignment differs from the root's: close it,
                        // then go through statx.
                        return self.submit_close(id, b, i, file, true);
                    }
                    let e = if errno == libc::EISDIR {
                        Error::new(ErrorKind::NotFound, "not a regular file")
                    } else {
                        Error::from_errno(errno, "read failed")
                    };
                    let e = b.err(i, e);
                    b.states[i].result = Some(Err(e));
                } else {
                    let n = res as usize;
                    st.filled += n;
                    let need = st.head + st.want;
                    // End of file: a read that returns nothing, or, where the size is not
                    // known (whole-file reads that skip statx), an O_DIRECT read that ends
                    // off the alignment (the kernel ends one short of the block only at end
                    // of file). Where the size is known, a short read is continued whatever
                    // its length, unless reads stop making progress (the file shrank).
                    let unaligned_end = st.direct && st.filled % st.align as usize != 0;
                    let mut eof = n == 0 || (st.size == SIZE_UNKNOWN && unaligned_end);
                    if st.filled < need && !eof && n < st.last_len {
                        if st.filled <= st.high {
                            st.retries += 1;
                            eof = st.retries >= MAX_RETRIES;
                        }
                        st.high = st.high.max(st.filled);
                    }
                    if st.filled < need && !eof {
                        if n < st.last_len {
                            // Short read before the end: continue from an aligned position.
                            if st.direct {
                                st.filled = align_down(st.filled as u64, st.align) as usize;
                            }
                            self.shared.stats.resubmits.fetch_add(1, Ordering::Relaxed);
                        }
                        return self.submit_read(id, b, i);
                    }
                    let st = &mut b.states[i];
                    st.filled = st.filled.max(st.high);
                    let got = st.filled.saturating_sub(st.head).min(st.want);
                    if got == 0
                        && guessed
                        && st.size == SIZE_UNKNOWN
                        && b.batch.get(i).is_some_and(|(_, e)| e.offset() > 0)
                    {
                        // Nothing at the offset, with the size unknown: statx says whether the
                        // range starts at the end (empty) or past it (an error).
                        return self.submit_close(id, b, i, file, true);
                    }
                    let head = st.head;
                    let res = match st.buf.as_mut() {
                        Some(buf) => buf.set_window(head, got).map(|()| got),
                        None => Err(Error::new(ErrorKind::InvalidInput, "request has no buffer")),
                    };
                    b.states[i].result = Some(res);
                }
                b.states[i].mark_latency();
                match b.target {
                    Target::Keys { .. } => self.submit_close(id, b, i, file, false),
                    Target::File { .. } => self.entry_done(b, i),
                }
            }
            Phase::Close { then_statx } => {
                if res < 0 {
                    tracing::debug!("close failed: {}", io::Error::from_raw_os_error(-res));
                }
                if then_statx {
                    return self.restart_slow(id, b, i);
                }
                self.entry_done(b, i)
            }
            Phase::Idle { .. } | Phase::Done => {}
        }
    }
}
