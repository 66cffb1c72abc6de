//! When two replicas that claim one model name serve different models (pure logic).

use tulip::proto::ModelInfo;

/// The first property in which `b` serves something other than `a`, as "field a vs b"; None
/// when they serve the same model. Placement (device, dtype, kernels, batch limits) may differ:
/// vectors then differ by rounding only.
pub fn differs(a: &ModelInfo, b: &ModelInfo) -> Option<String> {
    let fields: [(&str, String, String); 10] = [
        ("task", a.task.clone(), b.task.clone()),
        ("model_type", a.model_type.clone(), b.model_type.clone()),
        (
            "dimensions",
            a.dimensions.to_string(),
            b.dimensions.to_string(),
        ),
        (
            "max_input_length",
            a.max_input_length.to_string(),
            b.max_input_length.to_string(),
        ),
        (
            "vocab_size",
            a.vocab_size.to_string(),
            b.vocab_size.to_string(),
        ),
        (
            "type_vocab_size",
            a.type_vocab_size.to_string(),
            b.type_vocab_size.to_string(),
        ),
        ("pooling", a.pooling.clone(), b.pooling.clone()),
        ("labels", a.labels.join(","), b.labels.join(",")),
        ("modules", a.modules.join(","), b.modules.join(",")),
        (
            "weights",
            a.weights_fingerprint.clone(),
            b.weights_fingerprint.clone(),
        ),
    ];
    fields
        .into_iter()
        .find(|(_, x, y)| x != y)
        .map(|(name, x, y)| format!("{name} {y:?} (not {x:?})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_may_differ_but_not_the_model() {
        let a = ModelInfo {
            dimensions: 384,
            weights_fingerprint: "abc".into(),
            device: "cpu".into(),
            ..Default::default()
        };
        let on_gpu = ModelInfo {
            device: "cuda:0".into(),
            dtype: "bfloat16".into(),
            ..a.clone()
        };
        assert_eq!(differs(&a, &on_gpu), None);
        let other = ModelInfo {
            weights_fingerprint: "def".into(),
            ..a.clone()
        };
        assert!(differs(&a, &other).unwrap().starts_with("weights"));
    }
}
