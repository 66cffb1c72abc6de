//! How the model wants its inputs tokenized: prompts and maximum length, as reported by Tulip.

use std::collections::HashMap;

use serde::Deserialize;

use crate::error::IvyError;

/// The model's tokenization settings (ROSE's `Engine.tokenization()`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Template {
    pub max_input_length: usize,
    #[serde(default)]
    pub prompts: HashMap<String, String>,
    #[serde(default)]
    pub default_prompt_name: Option<String>,
    /// A score model's pairs: how a query and a document become one sequence.
    #[serde(default)]
    pub score: Option<PairTemplate>,
}

/// How a score model takes a (query, document) pair.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PairTemplate {
    /// Rendered into one text between a fixed prefix and suffix (a causal reranker's prompt):
    /// `content` names `{instruction}`, `{query}` and `{document}`.
    Rendered {
        prefix: String,
        content: String,
        suffix: String,
        default_instruction: String,
    },
    /// The tokenizer's own pair template (`[CLS] q [SEP] d [SEP]`, with token types).
    Tokenizer { pair: String },
}

impl Template {
    /// Parses the JSON Tulip sends.
    pub fn from_json(json: &str) -> Result<Template, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// The prompt text for `name`, else for the default prompt name; empty when there is none.
    pub fn prompt(&self, name: Option<&str>, fallback: Option<&str>) -> Result<&str, IvyError> {
        let Some(name) = name.or(fallback).or(self.default_prompt_name.as_deref()) else {
            return Ok("");
        };
        self.prompts.get(name).map(String::as_str).ok_or_else(|| {
            let mut known: Vec<_> = self.prompts.keys().map(String::as_str).collect();
            known.sort();
            IvyError::Validation(if known.is_empty() {
                format!("prompt `{name}` is unknown: the model defines no prompts")
            } else {
                format!(
                    "prompt `{name}` is unknown; the model defines: {}",
                    known.join(", ")
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> Template {
        Template::from_json(r#"{"max_input_length": 8, "prompts": {"query": "q: ", "doc": ""}, "default_prompt_name": "doc"}"#)
            .unwrap()
    }

    #[test]
    fn picks_the_named_then_the_fallback_then_the_default_prompt() {
        let t = template();
        assert_eq!(t.prompt(Some("query"), Some("doc")).unwrap(), "q: ");
        assert_eq!(t.prompt(None, Some("query")).unwrap(), "q: ");
        assert_eq!(t.prompt(None, None).unwrap(), "");
        assert_eq!(Template::default().prompt(None, None).unwrap(), "");
    }

    #[test]
    fn reads_both_kinds_of_pair_template() {
        let plain =
            Template::from_json(r#"{"max_input_length": 8, "score": {"pair": "tokenizer"}}"#);
        assert_eq!(
            plain.unwrap().score,
            Some(PairTemplate::Tokenizer {
                pair: "tokenizer".into()
            })
        );
        let json = r#"{"max_input_length": 8, "score": {"prefix": "p", "content": "{query}|{document}", "suffix": "s", "default_instruction": "i"}}"#;
        assert!(matches!(
            Template::from_json(json).unwrap().score,
            Some(PairTemplate::Rendered { .. })
        ));
        assert_eq!(template().score, None);
    }

    #[test]
    fn an_unknown_prompt_lists_the_known_ones() {
        let err = template()
            .prompt(Some("passage"), None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "prompt `passage` is unknown; the model defines: doc, query"
        );
    }
}
