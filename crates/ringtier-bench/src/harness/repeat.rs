//! Interleaved repeats: A, B, A, B, ... so that drift hits every side alike.

use anyhow::Result;

/// Runs every side once per repeat (`repeats` rounds), in order, or rotated by the repeat's
/// number when `rotate` (so no side always runs first); returns each side's results in
/// repeat order, `out[side][repeat]`.
pub(crate) fn interleaved<S, T>(
    repeats: usize,
    sides: &[S],
    rotate: bool,
    mut run: impl FnMut(usize, &S) -> Result<T>,
) -> Result<Vec<Vec<T>>> {
    let mut out: Vec<Vec<T>> = sides.iter().map(|_| Vec::with_capacity(repeats)).collect();
    for r in 0..repeats {
        for k in 0..sides.len() {
            let i = if rotate { (k + r) % sides.len() } else { k };
            out[i].push(run(r, &sides[i])?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_interleave_and_rotate() {
        let mut order = Vec::new();
        let out = interleaved(2, &["a", "b", "c"], true, |r, s| {
            order.push(format!("{s}{r}"));
            Ok(r)
        })
        .expect("run");
        assert_eq!(order, ["a0", "b0", "c0", "b1", "c1", "a1"]);
        assert_eq!(out, [[0, 1], [0, 1], [0, 1]]);
    }
}
