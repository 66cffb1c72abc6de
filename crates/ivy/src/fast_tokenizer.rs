//! The tokenizers crate's v1 encode pipeline beside its `Tokenizer`: the same ids several times
//! faster, since it normalizes and splits borrowed ranges where the `Tokenizer` keeps an
//! alignment per byte. v1 is a release candidate, so a model uses it only where it gives the
//! `Tokenizer`'s ids on the probe texts below at start; windows, offsets and decoding stay with
//! the `Tokenizer`.

use tokenizers::{
    EncodeInput, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};
use tokenizers_v1::pipeline::{EncodeOptions, Inputs, Override, PipelineTokenizer};
use tokenizers_v1::utils::truncation as v1;

/// A model's tokenizer.json as the v1 pipeline reads it (a cheap clone: one shared copy).
#[derive(Clone)]
pub struct FastTokenizer(PipelineTokenizer);

/// The ids of one text or pair, and their type ids (all 0 where the template sets none).
#[derive(Debug, Clone, PartialEq)]
pub struct Ids {
    pub ids: Vec<u32>,
    pub types: Vec<u32>,
}

/// Texts on which v1 must give the `Tokenizer`'s ids: each normalizer's and pre-tokenizer's
/// corners (accents, case, CJK, scripts, emoji sequences, control and odd whitespace, digits
/// and punctuation, a long word); the model's added tokens are probed inside text besides.
const PROBES: &[&str] = &[
    "The quick brown fox jumps over the lazy dog. How are you doing today?",
    "Café résumé naïve Ångström ÜBER straße STRASSE",
    "東京は日本の首都です。北京欢迎你 한국어 ไทย",
    "Привет мир, Ελληνικά, עברית, العربية, हिन्दी",
    "emoji 👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "tabs\tand\nnewlines\r\nand  double  spaces ",
    "control\u{0}\u{1}\u{7f} chars \u{fffd} replacement",
    "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ ﬁ ½ ² \u{200b}zero\u{200d}width\u{a0}nbsp\u{3000}",
    "x-ray's U.S.A. e.g. 3.14 1,000,000 $5 #tag @user http://example.com/a?b=c&d=e",
    "Supercalifragilisticexpialidocious-antidisestablishmentarianism_pneumonoultramicroscopic",
    " ",
    "",
];

impl FastTokenizer {
    /// Reads `json` and checks it against `reference` (the same file read by the `Tokenizer`);
    /// Err says why v1 is not used.
    pub fn load(json: &[u8], mut reference: Tokenizer) -> Result<FastTokenizer, String> {
        reference.with_padding(None);
        let mut value: serde_json::Value =
            serde_json::from_slice(json).map_err(|e| e.to_string())?;
        // v1 reads only its canonical form; published files are in the older one.
        tokenizers_v1::canonicalize_value(&mut value).map_err(|e| e.to_string())?;
        let pipeline = tokenizers_v1::from_json(&value.to_string()).map_err(|e| e.to_string())?;
        let fast = FastTokenizer(pipeline);
        fast.agrees_with(&mut reference).map(|()| fast)
    }

    /// The ids of `first` (or of the pair `first`, `second`), with the template's special tokens
    /// when `specials`, shortened as `cut` says when one is given.
    pub fn encode(
        &self,
        first: &str,
        second: Option<&str>,
        specials: bool,
        cut: Option<&TruncationParams>,
    ) -> Result<Ids, String> {
        let options = EncodeOptions {
            add_special_tokens: specials,
            padding: Override::Off,
            truncation: cut.map_or(Override::Off, |cut| Override::With(params(cut))),
            ..EncodeOptions::default()
        };
        let input: Inputs = match second {
            Some(second) => (first, second).into(),
            None => first.into(),
        };
        let mut encodings = self
            .0
            .encode(input, &options)
            .wait()
            .map_err(|e| e.to_string())?;
        let encoding = encodings.pop().ok_or("v1 returned no encoding")?;
        let ids: Vec<u32> = encoding.ids().iter().map(|&id| u32::from(id)).collect();
        let types = match encoding.type_ids() {
            Some(types) => types.iter().map(|&t| u32::from(t)).collect(),
            None => vec![0; ids.len()],
        };
        Ok(Ids { ids, types })
    }

    /// Err names the first probe on which the two tokenizers differ.
    fn agrees_with(&self, reference: &mut Tokenizer) -> Result<(), String> {
        let added = reference.get_added_tokens_decoder();
        let inside: Vec<String> = (added.values())
            .map(|token| format!("a{0}b {0} c", token.content))
            .collect();
        let texts: Vec<&str> = PROBES
            .iter()
            .copied()
            .chain(inside.iter().map(|s| s.as_str()))
            .collect();
        let query = PROBES[0];
        let cuts = [
            (
                8,
                TruncationStrategy::LongestFirst,
                TruncationDirection::Right,
            ),
            (
                8,
                TruncationStrategy::LongestFirst,
                TruncationDirection::Left,
            ),
            (
                24,
                TruncationStrategy::OnlySecond,
                TruncationDirection::Right,
            ),
        ];
        let cuts = cuts.map(|(max_length, strategy, direction)| {
            Some(TruncationParams {
                max_length,
                strategy,
                direction,
                stride: 0,
            })
        });
        for cut in std::iter::once(None).chain(cuts) {
            let _ = reference.with_truncation(cut.clone());
            for &text in &texts {
                for (first, second) in [(text, None), (query, Some(text)), (text, Some(query))] {
                    for specials in [true, false] {
                        let input: EncodeInput = match second {
                            Some(second) => (first, second).into(),
                            None => first.into(),
                        };
                        let theirs = (reference.encode_fast(input, specials)).map(|e| Ids {
                            ids: e.get_ids().to_vec(),
                            types: e.get_type_ids().to_vec(),
                        });
                        let ours = self.encode(first, second, specials, cut.as_ref());
                        let same = match (&theirs, &ours) {
                            (Ok(theirs), Ok(ours)) => theirs == ours,
                            (Err(_), Err(_)) => true,
                            _ => false,
                        };
                        if !same {
                            return Err(format!(
                                "it tokenizes {first:?} (paired with {second:?}) differently"
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn params(cut: &TruncationParams) -> v1::TruncationParams {
    v1::TruncationParams {
        direction: match cut.direction {
            TruncationDirection::Left => v1::TruncationDirection::Left,
            TruncationDirection::Right => v1::TruncationDirection::Right,
        },
        max_length: cut.max_length,
        strategy: match cut.strategy {
            TruncationStrategy::LongestFirst => v1::TruncationStrategy::LongestFirst,
            TruncationStrategy::OnlyFirst => v1::TruncationStrategy::OnlyFirst,
            TruncationStrategy::OnlySecond => v1::TruncationStrategy::OnlySecond,
        },
        stride: cut.stride,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// A word-level tokenizer, lower-casing its input when `lowercase`.
    fn json(lowercase: bool) -> String {
        let normalizer = if lowercase {
            r#"{"type": "Lowercase"}"#
        } else {
            "null"
        };
        let vocab = r#"{"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "the": 3, "quick": 4, "brown": 5}"#;
        format!(
            r#"{{"version": "1.0", "added_tokens": [], "normalizer": {normalizer}, "decoder": null,
                "truncation": null, "padding": null, "pre_tokenizer": {{"type": "Whitespace"}},
                "post_processor": {{"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]}},
                "model": {{"type": "WordLevel", "vocab": {vocab}, "unk_token": "[UNK]"}}}}"#
        )
    }

    #[test]
    fn gives_the_classic_ids_of_texts_and_pairs() {
        let classic = Tokenizer::from_str(&json(true)).unwrap();
        let fast = FastTokenizer::load(json(true).as_bytes(), classic).unwrap();
        let pair = fast
            .encode("The quick", Some("brown fox"), true, None)
            .unwrap();
        assert_eq!(pair.ids, [1, 3, 4, 2, 5, 0, 2]);
        assert_eq!(pair.types, [0, 0, 0, 0, 1, 1, 1]);
        let cut = truncation_params(6, TruncationStrategy::OnlySecond);
        let shortened = fast.encode("The quick", Some("brown fox"), true, Some(&cut));
        assert_eq!(shortened.unwrap().ids, [1, 3, 4, 2, 5, 2]);
        let impossible = truncation_params(5, TruncationStrategy::OnlySecond);
        assert!(fast
            .encode("The quick", Some("brown"), true, Some(&impossible))
            .is_err());
    }

    #[test]
    fn is_refused_where_it_differs_from_the_classic_tokenizer() {
        // The classic tokenizer lower-cases, this file does not: "The" is [UNK] to v1 only.
        let classic = Tokenizer::from_str(&json(true)).unwrap();
        let refused = FastTokenizer::load(json(false).as_bytes(), classic);
        let why = refused.err().expect("a differing tokenizer is refused");
        assert!(why.contains("The quick brown fox"), "{why}");
    }

    /// The published families' pipelines, each with a small vocabulary of its own kind: v1 must
    /// pass the probe check on all (ids, type ids and cuts equal), not only on WordPiece.
    #[test]
    fn passes_its_check_on_byte_level_unigram_and_byte_fallback_tokenizers() {
        for (family, json) in [
            ("Qwen2 (byte-level BPE)", qwen2_like()),
            ("XLM-R (Unigram)", xlm_r_like()),
            ("Gemma (BPE with byte fallback)", gemma_like()),
        ] {
            let text = json.to_string();
            let classic = Tokenizer::from_str(&text).unwrap();
            let fast = FastTokenizer::load(text.as_bytes(), classic)
                .unwrap_or_else(|why| panic!("{family}: {why}"));
            let ids = fast.encode(PROBES[1], None, true, None).unwrap().ids;
            let distinct: std::collections::HashSet<_> = ids.iter().collect();
            assert!(distinct.len() > 10, "{family}: {ids:?}");
        }
    }

    /// A few merges of letter pairs frequent in the probes, for the BPE tokenizers below.
    const MERGES: &[(&str, &str)] = &[("h", "e"), ("t", "he"), ("q", "u"), ("a", "n"), ("e", "r")];

    fn added(content: &str, id: usize) -> serde_json::Value {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    }

    fn qwen2_like() -> serde_json::Value {
        let mut alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .collect();
        alphabet.sort();
        let mut vocab: serde_json::Map<String, serde_json::Value> = (alphabet.iter().enumerate())
            .map(|(i, c)| (c.to_string(), i.into()))
            .collect();
        for (a, b) in MERGES {
            vocab.insert(format!("{a}{b}"), vocab.len().into());
        }
        let pattern = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": false, "use_regex": false});
        serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [added("<|endoftext|>", vocab.len())],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                byte_level]},
            "post_processor": byte_level, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": MERGES.iter().map(|(a, b)| [a, b]).collect::<Vec<_>>()}})
    }

    /// Pieces for the probes' characters (others are <unk>), a few longer ones scoring better.
    fn pieces() -> Vec<String> {
        let mut chars: Vec<char> = PROBES
            .concat()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        chars.sort();
        chars.dedup();
        let words = ["▁the", "▁quick", "he", "er", "an", "▁"];
        (words.iter().map(|w| w.to_string()))
            .chain(chars.iter().map(|c| c.to_string()))
            .collect()
    }

    fn xlm_r_like() -> serde_json::Value {
        let specials = ["<unk>", "<s>", "</s>"];
        let vocab: Vec<(String, f64)> = (specials.iter().map(|s| (s.to_string(), 0.0)))
            .chain(
                pieces()
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| (p, -2.0 - i as f64 / 100.0)),
            )
            .collect();
        serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [added("<unk>", 0), added("<s>", 1), added("</s>", 2)],
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"},
                {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
            "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1],
                "trim_offsets": true, "add_prefix_space": true},
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
            "model": {"type": "Unigram", "unk_id": 0, "vocab": vocab, "byte_fallback": false}})
    }

    fn gemma_like() -> serde_json::Value {
        let mut vocab = serde_json::Map::new();
        for token in ["<pad>", "<eos>", "<bos>", "<unk>"] {
            vocab.insert(token.into(), vocab.len().into());
        }
        for byte in 0..=255u8 {
            vocab.insert(format!("<0x{byte:02X}>"), vocab.len().into());
        }
        for piece in pieces() {
            vocab.insert(piece, vocab.len().into());
        }
        for (a, b) in MERGES {
            vocab.insert(format!("{a}{b}"), vocab.len().into());
        }
        let bos = serde_json::json!({"SpecialToken": {"id": "<bos>", "type_id": 0}});
        let sequence = |id| serde_json::json!({"Sequence": {"id": id, "type_id": 0}});
        serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [added("<pad>", 0), added("<eos>", 1), added("<bos>", 2), added("<unk>", 3)],
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            "pre_tokenizer": null,
            "post_processor": {"type": "TemplateProcessing", "single": [bos, sequence("A")],
                "pair": [bos, sequence("A"), bos, sequence("B")],
                "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
            "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": vocab, "merges": MERGES.iter().map(|(a, b)| [a, b]).collect::<Vec<_>>()}})
    }

    fn truncation_params(max_length: usize, strategy: TruncationStrategy) -> TruncationParams {
        TruncationParams {
            max_length,
            strategy,
            direction: TruncationDirection::Right,
            stride: 0,
        }
    }
}
