//! A save's parts as Python hands them over (exported buffers, read as one stream per part),
//! and a load's parts as Python gets them back (`PartBuffer`, the buffer protocol).

use super::*;

/// The parts of a save as Python hands them over: a name and the buffers to concatenate.
pub(super) type PyParts<'py> = Vec<(String, Vec<Bound<'py, PyAny>>)>;

/// Buffers exported by Python objects, held while their bytes are written.
pub(super) struct Exported {
    pub(super) names: Vec<String>,
    /// Per part, the buffers (kept alive: dropping one ends the export).
    buffers: Vec<Vec<PyUntypedBuffer>>,
}

impl Exported {
    pub(super) fn new(parts: PyParts<'_>) -> PyResult<Self> {
        let mut names = Vec::with_capacity(parts.len());
        let mut buffers = Vec::with_capacity(parts.len());
        for (name, objs) in parts {
            let mut bufs = Vec::with_capacity(objs.len());
            for (i, obj) in objs.iter().enumerate() {
                let buf = PyUntypedBuffer::get(obj).map_err(|e| {
                    errors::type_error(format!(
                        "part {name:?}, item {i}: a {} does not export a buffer ({e}); give bytes, a numpy array \
                         or a uint8 view of a tensor",
                        obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                    ))
                })?;
                if !buf.is_c_contiguous() {
                    return Err(errors::invalid(format!(
                        "part {name:?}, item {i}: the buffer is not C-contiguous (make it contiguous first)"
                    )));
                }
                bufs.push(buf);
            }
            names.push(name);
            buffers.push(bufs);
        }
        Ok(Exported { names, buffers })
    }

    /// The bytes of every buffer, per part.
    pub(super) fn slices(&self) -> Vec<Vec<&[u8]>> {
        self.buffers
            .iter()
            .map(|bufs| {
                bufs.iter()
                    .map(|b| {
                        let len = b.len_bytes();
                        if len == 0 {
                            return &[][..];
                        }
                        // SAFETY: a C-contiguous buffer of `len` bytes at `buf_ptr`, exported by
                        // an object the `PyUntypedBuffer` keeps alive (and locked against
                        // resizing) for as long as `self` lives, which outlives the slices.
                        unsafe { std::slice::from_raw_parts(b.buf_ptr().cast::<u8>().cast_const(), len) }
                    })
                    .collect()
            })
            .collect()
    }
}

/// A part that is several buffers end to end: read (and rewound) without joining them.
pub(super) struct Chain<'a> {
    slices: Vec<&'a [u8]>,
    /// Start offset of each slice.
    starts: Vec<u64>,
    pub(super) len: u64,
    pos: u64,
}

impl<'a> Chain<'a> {
    pub(super) fn new(slices: Vec<&'a [u8]>) -> Self {
        let mut starts = Vec::with_capacity(slices.len());
        let mut len = 0u64;
        for s in &slices {
            starts.push(len);
            len += s.len() as u64;
        }
        Chain { slices, starts, len, pos: 0 }
    }
}

impl Read for Chain<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let mut n = 0;
        while n < out.len() && self.pos < self.len {
            let i = self.starts.partition_point(|&s| s <= self.pos) - 1;
            let s = self.slices[i];
            let off = (self.pos - self.starts[i]) as usize;
            let k = (s.len() - off).min(out.len() - n);
            out[n..n + k].copy_from_slice(&s[off..off + k]);
            n += k;
            self.pos += k as u64;
        }
        Ok(n)
    }
}

impl Seek for Chain<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => p as i128,
            SeekFrom::Current(d) => self.pos as i128 + d as i128,
            SeekFrom::End(d) => self.len as i128 + d as i128,
        };
        if pos < 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start"));
        }
        self.pos = pos as u64;
        Ok(self.pos)
    }
}

/// A restored part's bytes, exposed through the buffer protocol (writable, format `B`):
/// tensors and arrays built over it share its memory.
#[pyclass(module = "ringtier._ringtier", name = "PartBuffer", frozen)]
#[derive(Debug)]
pub(crate) struct PartBuffer {
    bytes: ExportedBytes<PartBytes>,
}

/// Where a part's bytes live: read directly into a mapping of its own, or copied into a `Vec`.
#[derive(Debug)]
enum PartBytes {
    Mapped(crate::direct::Mapping),
    Heap(Vec<u8>),
}

impl crate::buffer::OwnedBytes for PartBytes {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        match self {
            PartBytes::Mapped(m) => crate::buffer::OwnedBytes::as_mut_bytes(m),
            PartBytes::Heap(v) => v.as_mut_slice(),
        }
    }
}

impl PartBuffer {
    /// A part copied into memory of its own.
    pub(super) fn new(data: Vec<u8>) -> Self {
        PartBuffer { bytes: ExportedBytes::new(PartBytes::Heap(data)) }
    }

    /// A part read directly into a mapping of its own.
    pub(super) fn mapped(map: crate::direct::Mapping) -> Self {
        PartBuffer { bytes: ExportedBytes::new(PartBytes::Mapped(map)) }
    }
}

#[pymethods]
impl PartBuffer {
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// Buffer views alive now.
    #[getter]
    fn views(&self) -> usize {
        self.bytes.views()
    }

    unsafe fn __getbuffer__(slf: PyRef<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        // SAFETY: `slf` is the object that owns `bytes`; its `__releasebuffer__` releases the view.
        unsafe { slf.bytes.get_buffer(slf.py(), slf.as_ptr(), view, flags, "this part buffer was released") }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.bytes.release_view();
    }
}
