//! Inputs longer than the model (`--long-inputs chunk`): the vectors of an input's windows
//! combined into one, a mean weighted by each window's tokens, then shaped as the request asks
//! (Matryoshka truncation, normalization, quantization: Tulip's own rule, tulip::postprocess).

use tulip::postprocess::{append_row, Shape};

/// The window vectors of every input, in order: `raw` holds one float32 row of `width` values a
/// window; `windows[i]` lists input i's windows' token counts. Returns one shaped row an input.
pub fn combine(raw: &[f32], width: usize, windows: &[Vec<usize>], shape: Shape) -> Vec<u8> {
    let mut out = Vec::with_capacity(windows.len() * shape.row_bytes());
    let mut rows = raw.chunks_exact(width);
    let mut mean = vec![0f32; width];
    for lengths in windows {
        mean.fill(0.0);
        let total: usize = lengths.iter().sum();
        for (&tokens, row) in lengths.iter().zip(rows.by_ref()) {
            let weight = tokens as f32 / total.max(1) as f32;
            mean.iter_mut().zip(row).for_each(|(m, x)| *m += weight * x);
        }
        append_row(&mean, shape, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicas::floats;
    use tulip::proto::Encoding;

    #[test]
    fn windows_are_averaged_by_their_tokens_and_a_single_window_is_kept() {
        // Input 0: two windows of 3 and 1 tokens; input 1: one window.
        let raw = [1.0, 0.0, 0.0, 4.0, 2.0, 2.0];
        let shape = Shape {
            dimensions: 2,
            normalize: false,
            encoding: Encoding::Float32,
        };
        let out = floats(&combine(&raw, 2, &[vec![3, 1], vec![5]], shape));
        assert_eq!(out, vec![0.75, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn the_combined_vector_is_shaped_after_the_mean() {
        let raw = [3.0, 0.0, 9.0, 0.0, 4.0, 9.0];
        let shape = Shape {
            dimensions: 2,
            normalize: true,
            encoding: Encoding::Float32,
        };
        // Mean (1.5, 2.0, 9.0), truncated to 2 then normalized: (0.6, 0.8).
        let out = floats(&combine(&raw, 3, &[vec![1, 1]], shape));
        assert!(
            (out[0] - 0.6).abs() < 1e-6 && (out[1] - 0.8).abs() < 1e-6,
            "{out:?}"
        );
    }
}
