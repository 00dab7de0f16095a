//! The element types of the format, in the order the `safetensors` package sorts them by.

use std::fmt;
use std::str::FromStr;

/// An element type of a safetensors tensor.
///
/// The declaration order is the format's: the `safetensors` package writes tensors sorted by
/// dtype in *descending* order of this list (`U64` first), then by name, and [`crate::save`]
/// does the same so that both write the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[allow(non_camel_case_types)]
pub enum Dtype {
    /// Boolean, one byte.
    BOOL,
    /// MXFP4 (E2M1), two values packed per byte.
    F4,
    /// MXFP6 E2M3, 6 bits.
    F6_E2M3,
    /// MXFP6 E3M2, 6 bits.
    F6_E3M2,
    /// Unsigned byte.
    U8,
    /// Signed byte.
    I8,
    /// FP8 E5M2.
    F8_E5M2,
    /// FP8 E4M3 (`float8_e4m3fn`).
    F8_E4M3,
    /// FP8 E8M0 (MX scale, `float8_e8m0fnu`).
    F8_E8M0,
    /// FP8 E4M3, finite, no negative zero (`float8_e4m3fnuz`).
    F8_E4M3FNUZ,
    /// FP8 E5M2, finite, no negative zero (`float8_e5m2fnuz`).
    F8_E5M2FNUZ,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single precision.
    F32,
    /// Complex of two 32-bit floats.
    C64,
    /// IEEE double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl Dtype {
    /// Every dtype, in the format's order.
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// Bits per element (4 and 6 for the packed MX types).
    pub fn bits(self) -> u64 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6_E2M3 | Dtype::F6_E3M2 => 6,
            Dtype::BOOL
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8_E5M2
            | Dtype::F8_E4M3
            | Dtype::F8_E8M0
            | Dtype::F8_E4M3FNUZ
            | Dtype::F8_E5M2FNUZ => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::C64 | Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
        }
    }

    /// The name the header uses (`"BF16"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::F4 => "F4",
            Dtype::F6_E2M3 => "F6_E2M3",
            Dtype::F6_E3M2 => "F6_E3M2",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            Dtype::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::C64 => "C64",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Bytes a tensor of `shape` takes: `None` when the element count times the bits
    /// overflows, or when the bits do not fill whole bytes (a packed type with an odd count).
    pub fn byte_len(self, shape: &[u64]) -> Option<u64> {
        let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        let bits = elements.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Dtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Dtype::ALL.iter().copied().find(|d| d.as_str() == s).ok_or_else(|| format!("unknown dtype {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_order_is_the_formats() {
        for d in Dtype::ALL {
            assert_eq!(d.as_str().parse::<Dtype>(), Ok(d));
        }
        let mut sorted = Dtype::ALL;
        sorted.sort();
        assert_eq!(sorted, Dtype::ALL);
        assert!("F128".parse::<Dtype>().is_err());
    }

    #[test]
    fn byte_lengths_are_checked() {
        assert_eq!(Dtype::F32.byte_len(&[2, 3]), Some(24));
        assert_eq!(Dtype::F32.byte_len(&[]), Some(4));
        assert_eq!(Dtype::BF16.byte_len(&[0, 7]), Some(0));
        assert_eq!(Dtype::F4.byte_len(&[3]), None);
        assert_eq!(Dtype::F4.byte_len(&[4]), Some(2));
        assert_eq!(Dtype::F6_E2M3.byte_len(&[4]), Some(3));
        assert_eq!(Dtype::U64.byte_len(&[u64::MAX, 2]), None);
        assert_eq!(Dtype::U64.byte_len(&[1 << 61]), None);
    }
}
