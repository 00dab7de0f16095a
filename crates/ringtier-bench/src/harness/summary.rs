//! min / median / max over repeats, and ratios taken pair by pair.

use serde::Serialize;

/// min / median / max of a set of samples (non-finite samples left out; all NaN when none).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Summary {
    pub(crate) min: f64,
    pub(crate) median: f64,
    pub(crate) max: f64,
}

impl Summary {
    /// The summary of `samples`.
    pub(crate) fn of(samples: &[f64]) -> Summary {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Summary { min: f64::NAN, median: f64::NAN, max: f64::NAN };
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Summary { min: v[0], median, max: v[n - 1] }
    }

    /// The summary of `f` over `items` (one sample per run).
    pub(crate) fn by<T>(items: impl IntoIterator<Item = T>, f: impl Fn(T) -> f64) -> Summary {
        Summary::of(&items.into_iter().map(f).collect::<Vec<_>>())
    }

    /// The ratio `ours[i] / base[i]` pair by pair (the same repeat), summarized: the one way
    /// a side is compared with its baseline measured in the same run.
    pub(crate) fn ratio(ours: &[f64], base: &[f64]) -> Summary {
        Summary::of(&ours.iter().zip(base).map(|(o, b)| o / b).collect::<Vec<_>>())
    }

    /// `median (min..max)` with `digits` decimals.
    pub(crate) fn text(&self, digits: usize) -> String {
        format!("{:.d$} ({:.d$}..{:.d$})", self.median, self.min, self.max, d = digits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_odd_and_even_and_ratios_pair_by_pair() {
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]), Summary { min: 1.0, median: 2.0, max: 3.0 });
        assert_eq!(Summary::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert!(Summary::of(&[]).median.is_nan());
        let r = Summary::ratio(&[2.0, 6.0, 3.0], &[1.0, 2.0, 3.0]);
        assert_eq!(r, Summary { min: 1.0, median: 2.0, max: 3.0 });
        assert_eq!(Summary::by([1u32, 2, 3], f64::from).median, 2.0);
        assert_eq!(r.text(1), "2.0 (1.0..3.0)");
    }
}
