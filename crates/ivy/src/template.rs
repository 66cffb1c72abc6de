//! How the model wants its inputs tokenized: prompts and maximum length, a score model's pairs, a
//! ColBERT model's queries and documents, as reported by Tulip.

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
    /// A ColBERT model's queries and documents (PyLate's settings, as token ids).
    #[serde(default)]
    pub multi_vector: Option<ColbertTemplate>,
}

/// Whether an input is a query or a document: a ColBERT model takes each its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    Query,
    #[default]
    Document,
}

/// How a ColBERT model takes its inputs, as PyLate tokenizes them: the role's prefix token after
/// the first one, within the role's length; a query padded with the expansion token to its
/// length; a document's skiplist tokens left out of its vectors.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ColbertTemplate {
    pub query_prefix_id: Option<u32>,
    pub document_prefix_id: Option<u32>,
    pub query_length: usize,
    pub document_length: usize,
    /// The token a query is padded with (None: no query expansion).
    pub expansion_id: Option<u32>,
    pub skiplist_ids: Vec<u32>,
}

impl Role {
    /// The role's name, as requests and prompts give it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Query => "query",
            Role::Document => "document",
        }
    }
}

impl ColbertTemplate {
    fn prefix(&self, role: Role) -> Option<u32> {
        match role {
            Role::Query => self.query_prefix_id,
            Role::Document => self.document_prefix_id,
        }
    }

    /// The most tokens the tokenizer may give an input of `role`, special tokens included:
    /// the role's length, less the prefix token.
    pub fn limit(&self, role: Role) -> usize {
        let length = match role {
            Role::Query => self.query_length,
            Role::Document => self.document_length,
        };
        length - usize::from(self.prefix(role).is_some())
    }

    /// The model's sequence of an input the tokenizer gave `ids` (within `limit`).
    pub fn apply(&self, mut ids: Vec<u32>, role: Role) -> Vec<u32> {
        if let Some(prefix) = self.prefix(role) {
            ids.insert(1.min(ids.len()), prefix);
        }
        if let (Role::Query, Some(expansion)) = (role, self.expansion_id) {
            ids.resize(ids.len().max(self.query_length), expansion);
        }
        ids
    }

    /// Tokens whose vectors an input of `role` leaves out.
    pub fn skipped(&self, role: Role) -> &[u32] {
        match role {
            Role::Query => &[],
            Role::Document => &self.skiplist_ids,
        }
    }
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
    fn a_colbert_query_is_prefixed_and_expanded_and_a_document_prefixed_only() {
        let json = r#"{"max_input_length": 8, "multi_vector": {"query_prefix_id": 50, "document_prefix_id": 51,
            "query_length": 6, "document_length": 5, "expansion_id": 9, "skiplist_ids": [4]}}"#;
        let colbert = Template::from_json(json).unwrap().multi_vector.unwrap();
        assert_eq!(
            (colbert.limit(Role::Query), colbert.limit(Role::Document)),
            (5, 4)
        );
        assert_eq!(
            colbert.apply(vec![1, 7, 2], Role::Query),
            [1, 50, 7, 2, 9, 9]
        );
        assert_eq!(
            colbert.apply(vec![1, 7, 4, 2], Role::Document),
            [1, 51, 7, 4, 2]
        );
        assert_eq!(
            (
                colbert.skipped(Role::Query),
                colbert.skipped(Role::Document)
            ),
            (&[][..], &[4][..])
        );
        let plain = ColbertTemplate {
            query_prefix_id: None,
            expansion_id: None,
            ..colbert
        };
        assert_eq!(plain.limit(Role::Query), 6);
        assert_eq!(plain.apply(vec![1, 7, 2], Role::Query), [1, 7, 2]);
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
