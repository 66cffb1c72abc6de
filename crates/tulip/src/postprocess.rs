//! Per-request shaping of pooled vectors: Matryoshka truncation, normalization, quantization.
//! It runs per request rather than per batch because requests packed together ask for different
//! shapes.

use crate::proto::Encoding;

/// How one request wants its vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Keep the first `dimensions` values (Matryoshka truncation).
    pub dimensions: usize,
    /// L2-normalize after truncation (float32 only).
    pub normalize: bool,
    pub encoding: Encoding,
}

impl Shape {
    /// Bytes that one vector takes in this shape.
    pub fn row_bytes(&self) -> usize {
        match self.encoding {
            Encoding::Float32 => self.dimensions * 4,
            Encoding::Int8 => self.dimensions,
            Encoding::Binary => self.dimensions.div_ceil(8),
        }
    }
}

/// Appends one pooled vector, shaped, to `out`.
pub fn append_row(pooled: &[f32], shape: Shape, out: &mut Vec<u8>) {
    let v = &pooled[..shape.dimensions];
    match shape.encoding {
        Encoding::Float32 => {
            let scale = if shape.normalize {
                inverse_norm(v)
            } else {
                1.0
            };
            out.extend(v.iter().flat_map(|x| (x * scale).to_le_bytes()));
        }
        // pplx-embed's int8 output: round(tanh(x) * 127).
        Encoding::Int8 => out.extend(v.iter().map(|x| ((x.tanh() * 127.0).round() as i8) as u8)),
        Encoding::Binary => out.extend(v.chunks(8).map(|bits| {
            bits.iter()
                .enumerate()
                .fold(0u8, |byte, (i, &x)| byte | (u8::from(x > 0.0) << (7 - i)))
        })),
    }
}

/// A score model's logits for one sequence as probabilities, unless `raw`: the sigmoid of a
/// single logit (a relevance score, as cross-encoders publish it), the softmax of several.
pub fn score_row(logits: &[f32], raw: bool, out: &mut Vec<f32>) {
    if raw {
        out.extend_from_slice(logits);
    } else if let [logit] = logits {
        out.push(1.0 / (1.0 + (-logit).exp()));
    } else {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = logits.iter().map(|x| (x - max).exp()).sum();
        out.extend(logits.iter().map(|x| (x - max).exp() / sum));
    }
}

/// `v` scaled to unit length (an all-zero vector stays zero).
pub fn normalized(v: &[f32]) -> Vec<f32> {
    let scale = inverse_norm(v);
    v.iter().map(|x| x * scale).collect()
}

fn inverse_norm(v: &[f32]) -> f32 {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    // Same guard as torch.nn.functional.normalize: an all-zero vector stays zero.
    1.0 / norm.max(1e-12)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn shape(dimensions: usize, normalize: bool, encoding: Encoding) -> Shape {
        Shape {
            dimensions,
            normalize,
            encoding,
        }
    }

    #[test]
    fn truncates_then_normalizes() {
        let mut out = Vec::new();
        append_row(
            &[3.0, 4.0, 100.0],
            shape(2, true, Encoding::Float32),
            &mut out,
        );
        assert_eq!(floats(&out), [0.6, 0.8]);
    }

    #[test]
    fn leaves_vectors_alone_without_normalize() {
        let mut out = Vec::new();
        append_row(&[3.0, -4.0], shape(2, false, Encoding::Float32), &mut out);
        assert_eq!(floats(&out), [3.0, -4.0]);
    }

    #[test]
    fn a_zero_vector_stays_zero() {
        let mut out = Vec::new();
        append_row(&[0.0, 0.0], shape(2, true, Encoding::Float32), &mut out);
        assert_eq!(floats(&out), [0.0, 0.0]);
    }

    #[test]
    fn int8_is_rounded_tanh_times_127() {
        let mut out = Vec::new();
        append_row(
            &[0.0, 10.0, -10.0, 0.5],
            shape(4, false, Encoding::Int8),
            &mut out,
        );
        let values: Vec<i8> = out.iter().map(|&b| b as i8).collect();
        assert_eq!(
            values,
            [0, 127, -127, (0.5f32.tanh() * 127.0).round() as i8]
        );
    }

    #[test]
    fn scores_are_the_sigmoid_of_one_logit_or_the_softmax_of_several() {
        let mut out = Vec::new();
        score_row(&[0.0], false, &mut out);
        score_row(&[2.0], true, &mut out);
        score_row(&[1.0, 1.0], false, &mut out);
        score_row(&[1000.0, 0.0], false, &mut out);
        assert_eq!(out, [0.5, 2.0, 0.5, 0.5, 1.0, 0.0]);
    }

    #[test]
    fn binary_packs_signs_most_significant_bit_first() {
        let mut out = Vec::new();
        let v = [1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0, 2.0, 0.0];
        append_row(&v, shape(10, false, Encoding::Binary), &mut out);
        assert_eq!(out, [0b1011_0001, 0b1000_0000]);
        assert_eq!(shape(10, false, Encoding::Binary).row_bytes(), 2);
    }
}
