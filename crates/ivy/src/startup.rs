//! The table `ivy-serve` logs once it serves: what runs where, in one place to read.

use serde_json::Value;
use tulip::proto::ModelInfo;

/// The start-up table: the model as the engine reports it (`model`), its live state
/// (`engine`, the Info RPC's engine_json) and where it listens (`endpoints`).
pub fn table(model: &ModelInfo, engine: &Value, endpoints: &[(&str, String)]) -> String {
    let text = |key: &str| match &engine[key] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let graphs = engine["cuda_graphs"]["mode"]
        .as_str()
        .unwrap_or("off")
        .to_string();
    let fidelity = match &engine["fidelity"] {
        Value::Null if model.dtype == "float32" => "float32: the reference itself".to_string(),
        Value::Null => "pending (checked against float32 on the first batches)".to_string(),
        value => value.to_string(),
    };
    let mut rows = vec![
        ("model", model.model_id.clone()),
        ("path", model.model_path.clone()),
        ("kind", format!("{} ({})", model.task, model.model_type)),
        ("pooling", model.pooling.clone()),
        ("dimensions", model.dimensions.to_string()),
        ("modules", model.modules.join(", ")),
        ("dtype", model.dtype.clone()),
        ("device", model.device.clone()),
        ("attention", text("attention_backend")),
        ("decoder", model.fused_decoder.clone()),
        ("cuda graphs", graphs),
        ("fidelity", fidelity),
        ("max input", format!("{} tokens", model.max_input_length)),
    ];
    rows.extend(endpoints.iter().cloned());
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(key, value)| format!("  {key:<width$}  {value}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_a_field_aligned() {
        let model = ModelInfo {
            model_id: "m".into(),
            task: "embed".into(),
            model_type: "bert".into(),
            ..Default::default()
        };
        let engine = serde_json::json!({"attention_backend": "sdpa", "fidelity": null});
        let out = table(&model, &engine, &[("http", "http://0.0.0.0:3000".into())]);
        assert!(out.contains("  model        m\n"), "{out}");
        assert!(out.contains("  kind         embed (bert)\n"), "{out}");
        assert!(out.contains("  attention    sdpa\n"), "{out}");
        assert!(out.ends_with("  http         http://0.0.0.0:3000"), "{out}");
    }
}
