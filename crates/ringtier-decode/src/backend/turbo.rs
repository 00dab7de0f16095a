//! libjpeg-turbo 3.1 through the `turbojpeg` crate's bindings (bundled source, SIMD
//! required), with DCT-domain downscaling by 1/2, 1/4 or 1/8 and partial decompression of
//! the region the transforms use (`tj3SetCroppingRegion`: rows below the window are never
//! decoded, columns outside it are not inverse-transformed or color-converted).
//!
//! The `turbojpeg` crate's safe `Decompressor` has no cropping region, so this holds its own
//! TurboJPEG handle: the FFI is fenced in [`Handle`], each call's contract stated there.

use std::ffi::{c_int, CStr};

use ringtier_core::error::{Error, ErrorKind, Result};
use turbojpeg::raw;

use super::{corrupt, Decoded, Plan};

/// The decoder's name in reports.
pub(crate) const NAME: &str = "libjpeg-turbo";

/// One TurboJPEG decompression instance. Invariant: `ptr` is a non-null handle from
/// `tj3Init(TJINIT_DECOMPRESS)`, owned by this value alone and destroyed once in `Drop`.
struct Handle {
    ptr: raw::tjhandle,
}

// SAFETY: a TurboJPEG handle holds no thread-affine state (libjpeg-turbo documents instances as
// usable from any thread, one thread at a time); `&mut self` on every call below gives that.
unsafe impl Send for Handle {}

impl Handle {
    fn new() -> Result<Self> {
        // SAFETY: tj3Init takes an init type by value and returns a new handle or null.
        let ptr = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as c_int) };
        if ptr.is_null() {
            return Err(Error::new(ErrorKind::ResourceExhausted, "libjpeg-turbo: cannot create a decompressor"));
        }
        Ok(Handle { ptr })
    }

    /// The instance's last error, as a corrupt-input error.
    fn error(&mut self) -> Error {
        // SAFETY: `ptr` is a live handle; tj3GetErrorStr returns a NUL-terminated string owned
        // by the instance, valid until its next call, copied out here at once.
        let msg = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.ptr)) };
        corrupt(msg.to_string_lossy())
    }

    fn check(&mut self, rc: c_int) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn header(&mut self, jpeg: &[u8]) -> Result<()> {
        let len = jpeg_len(jpeg)?;
        // SAFETY: `jpeg` is a live slice of `len` bytes for the call's duration; the library
        // only reads it.
        let rc = unsafe { raw::tj3DecompressHeader(self.ptr, jpeg.as_ptr(), len) };
        self.check(rc)
    }

    fn get(&mut self, param: raw::TJPARAM) -> c_int {
        // SAFETY: `ptr` is a live handle; tj3Get reads one parameter (-1 if unknown).
        unsafe { raw::tj3Get(self.ptr, param as c_int) }
    }

    fn set_scaling(&mut self, denom: usize) -> Result<()> {
        let sf = raw::tjscalingfactor { num: 1, denom: denom as c_int };
        // SAFETY: `ptr` is a live handle; the factor is passed by value.
        let rc = unsafe { raw::tj3SetScalingFactor(self.ptr, sf) };
        self.check(rc)
    }

    fn set_crop(&mut self, x: usize, y: usize, w: usize, h: usize) -> Result<()> {
        let r = raw::tjregion { x: x as c_int, y: y as c_int, w: w as c_int, h: h as c_int };
        // SAFETY: `ptr` is a live handle whose header was read; the region is passed by value
        // and checked by the library against the scaled image (an error, not UB, if off).
        let rc = unsafe { raw::tj3SetCroppingRegion(self.ptr, r) };
        self.check(rc)
    }

    /// Decompresses into `out`, exactly `width * 3 * height` bytes of the (cropped, scaled)
    /// image's RGB rows.
    fn decompress(&mut self, jpeg: &[u8], out: &mut [u8], width: usize, height: usize) -> Result<()> {
        let pitch = width * 3;
        let len = jpeg_len(jpeg)?;
        if out.len() != pitch * height || pitch > c_int::MAX as usize {
            return Err(Error::new(ErrorKind::InvalidInput, "libjpeg-turbo: output buffer of the wrong size"));
        }
        // SAFETY: `jpeg` is read-only input of its length; `out` is a live, exclusively
        // borrowed buffer of `pitch * height` bytes, and the library writes `height` rows of
        // `pitch` bytes: the dimensions of the current scaling and cropping region, which the
        // caller computed with the library's own rules (TJSCALED) and the region it set.
        let rc = unsafe {
            raw::tj3Decompress8(
                self.ptr,
                jpeg.as_ptr(),
                len,
                out.as_mut_ptr(),
                pitch as c_int,
                raw::TJPF_TJPF_RGB as c_int,
            )
        };
        self.check(rc)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from tj3Init and is destroyed exactly once, here.
        unsafe { raw::tj3Destroy(self.ptr) }
    }
}

/// The input's length as the library's `size_t`.
fn jpeg_len(jpeg: &[u8]) -> Result<raw::size_t> {
    raw::size_t::try_from(jpeg.len()).map_err(|_| corrupt("the JPEG is too large"))
}

/// The iMCU width of a subsampling (TurboJPEG's `tjMCUWidth`), None when unknown.
fn mcu_width(subsamp: c_int) -> Option<usize> {
    match subsamp {
        0 | 3 | 4 | 6 => Some(8), // 4:4:4, gray, 4:4:0, 4:4:1
        1 | 2 => Some(16),        // 4:2:2, 4:2:0
        5 => Some(32),            // 4:1:1
        _ => None,
    }
}

/// `TJSCALED`: a dimension scaled by 1/`denom`, rounded up.
fn scaled(dim: usize, denom: usize) -> usize {
    dim.div_ceil(denom)
}

/// One libjpeg-turbo decompressor handle.
pub(crate) struct Backend {
    tj: Handle,
}

impl Backend {
    pub(crate) fn new() -> Result<Self> {
        Ok(Backend { tj: Handle::new()? })
    }

    /// Decodes `jpeg` into `pixels` (grown as needed) as RGB. `plan` sees the full width and
    /// height, may refuse them, and says the DCT scaling wanted (1, 2, 4 or 8; lossless JPEGs
    /// are never scaled) and the window of the full image the transforms read: only that part
    /// (widened to the iMCU grid on the left) is decoded.
    pub(crate) fn decode(
        &mut self,
        jpeg: &[u8],
        pixels: &mut Vec<u8>,
        plan: impl FnOnce(usize, usize) -> Result<Plan>,
    ) -> Result<Decoded> {
        self.tj.header(jpeg)?;
        let (w, h) = (self.tj.get(raw::TJPARAM_TJPARAM_JPEGWIDTH), self.tj.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT));
        let (w, h) = match (usize::try_from(w), usize::try_from(h)) {
            (Ok(w), Ok(h)) => (w, h),
            _ => return Err(corrupt("no frame header")),
        };
        let want = plan(w, h)?;
        let lossless = self.tj.get(raw::TJPARAM_TJPARAM_LOSSLESS) != 0;
        let denom = if lossless { 1 } else { want.denominator };
        self.tj.set_scaling(denom)?;
        let (sw, sh) = (scaled(w, denom), scaled(h, denom));
        // The window in scaled pixels: the left edge down to the scaled iMCU grid (the
        // library's rule), the rest to whole pixels; the whole image where it cannot crop.
        let (mut x0, mut y0, mut x1, mut y1) = (0, 0, sw, sh);
        let subsamp = self.tj.get(raw::TJPARAM_TJPARAM_SUBSAMP);
        if let (Some(win), Some(mcu), false) = (want.window, mcu_width(subsamp), lossless) {
            let (fx, fy) = (sw as f64 / w as f64, sh as f64 / h as f64);
            let step = scaled(mcu, denom).max(1);
            let left = ((win.left * fx).floor().max(0.0) as usize).min(sw.saturating_sub(1));
            x0 = left / step * step;
            y0 = ((win.top * fy).floor().max(0.0) as usize).min(sh.saturating_sub(1));
            x1 = (((win.left + win.width) * fx).ceil() as usize).clamp(x0 + 1, sw);
            y1 = (((win.top + win.height) * fy).ceil() as usize).clamp(y0 + 1, sh);
        }
        let cropped = (x0, y0, x1, y1) != (0, 0, sw, sh);
        if cropped {
            self.tj.set_crop(x0, y0, x1 - x0, y1 - y0)?;
        } else {
            self.tj.set_crop(0, 0, 0, 0)?;
        }
        let (cw, ch) = (x1 - x0, y1 - y0);
        let n = cw * ch * 3;
        if pixels.len() < n {
            pixels.resize(n, 0);
        }
        self.tj.decompress(jpeg, &mut pixels[..n], cw, ch)?;
        Ok(Decoded { full: (w, h), scaled: (sw, sh), denominator: denom, origin: (x0, y0), extent: (cw, ch) })
    }
}
