//! Reading the `input` / `inputs` field of a request, with errors that name the offending item.

use serde_json::Value;

use crate::error::IvyError;

/// One input: text to tokenize, or token ids to embed as they are.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Text(String),
    Ids(Vec<u32>),
}

/// Parses `field` of a request: a string, a list of strings, a list of token ids, or a list of
/// such lists.
pub fn parse_inputs(value: &Value, field: &str) -> Result<Vec<Input>, IvyError> {
    let invalid = |msg: String| Err(IvyError::Validation(msg));
    match value {
        Value::String(text) => Ok(vec![Input::Text(text.clone())]),
        Value::Array(items) if items.is_empty() => invalid(format!("`{field}` cannot be empty")),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            Ok(vec![Input::Ids(token_ids(items, field)?)])
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(Input::Text(text.clone())),
                Value::Array(ids) if ids.iter().all(Value::is_number) => {
                    Ok(Input::Ids(token_ids(ids, &format!("{field}[{i}]"))?))
                }
                other => Err(IvyError::Validation(format!(
                    "`{field}[{i}]` must be a string or a list of token ids, not {}",
                    kind(other)
                ))),
            })
            .collect(),
        Value::Null => invalid(format!("`{field}` is required")),
        other => invalid(format!(
            "`{field}` must be a string, a list of strings or a list of token ids, not {}",
            kind(other)
        )),
    }
}

fn token_ids(items: &[Value], field: &str) -> Result<Vec<u32>, IvyError> {
    items
        .iter()
        .enumerate()
        .map(|(i, id)| {
            id.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    IvyError::Validation(format!(
                        "`{field}[{i}]` must be a non-negative integer token id, not {id}"
                    ))
                })
        })
        .collect()
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<Vec<Input>, String> {
        parse_inputs(&value, "input").map_err(|e| e.to_string())
    }

    fn text(s: &str) -> Input {
        Input::Text(s.into())
    }

    #[test]
    fn accepts_every_openai_form() {
        assert_eq!(parse(json!("a")).unwrap(), [text("a")]);
        assert_eq!(parse(json!(["a", "b"])).unwrap(), [text("a"), text("b")]);
        assert_eq!(parse(json!([1, 2])).unwrap(), [Input::Ids(vec![1, 2])]);
        assert_eq!(
            parse(json!([[1], [2, 3]])).unwrap(),
            [Input::Ids(vec![1]), Input::Ids(vec![2, 3])]
        );
        assert_eq!(
            parse(json!(["a", [7]])).unwrap(),
            [text("a"), Input::Ids(vec![7])]
        );
    }

    #[test]
    fn names_the_bad_item() {
        assert_eq!(parse(json!([])).unwrap_err(), "`input` cannot be empty");
        assert!(parse(json!(["a", 3, "b"]))
            .unwrap_err()
            .contains("`input[1]`"));
        assert!(parse(json!(["a", {"x": 1}]))
            .unwrap_err()
            .contains("`input[1]` must be a string"));
        assert!(parse(json!(["a", null])).unwrap_err().contains("not null"));
        assert!(parse(json!([1, -2]))
            .unwrap_err()
            .contains("`input[1]` must be a non-negative integer"));
        assert!(parse(json!([[1], [1.5]]))
            .unwrap_err()
            .contains("`input[1][0]`"));
        assert!(parse(json!([[1], [4294967296u64]]))
            .unwrap_err()
            .contains("`input[1][0]`"));
        assert!(parse(json!(42)).unwrap_err().contains("not a number"));
        assert!(parse(Value::Null).unwrap_err().contains("required"));
    }
}
