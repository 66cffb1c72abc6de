//! API keys: the flags that set them and the check both servers make (Ivy on its HTTP routes,
//! Tulip on its RPCs). Only the keys' SHA-256 digests are compared, in constant time, so that
//! neither a key's length nor its first differing byte shows in the answer's timing.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::heading;

/// A key as given on the command line, never printed.
#[derive(Clone)]
pub struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

fn secret(value: &str) -> Result<Secret, String> {
    if value.trim().is_empty() {
        return Err("an API key cannot be empty".into());
    }
    Ok(Secret(value.trim().to_string()))
}

/// Flags of the API keys (ivy-serve and tulip-serve).
#[derive(Debug, Clone, Default, Args)]
pub struct AuthArgs {
    /// API keys (repeat or comma-separate). When set, every HTTP route but /health and /live
    /// needs `Authorization: Bearer KEY`, and every Tulip RPC but health the same in its metadata;
    /// Ivy sends the first key to its Tulips.
    #[arg(long = "api-key", env = "API_KEY", value_delimiter = ',', value_parser = secret,
          hide_env_values = true, help_heading = heading::SECURITY)]
    pub api_key: Vec<Secret>,

    /// A file of API keys, one a line (blank lines and lines starting with # skipped), added to
    /// --api-key's.
    #[arg(long, env = "API_KEY_FILE", help_heading = heading::SECURITY)]
    pub api_key_file: Option<PathBuf>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    /// No `Authorization: Bearer` header (or metadata).
    #[error("this server needs an API key: send `Authorization: Bearer <key>`")]
    Missing,
    /// A key that is not one of the server's.
    #[error("the API key is not valid")]
    Wrong,
}

impl AuthFailure {
    /// The label of the failures counter.
    pub fn reason(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Wrong => "wrong",
        }
    }
}

/// The keys a server accepts (none: open), and the key it sends to the servers it calls.
#[derive(Clone, Default)]
pub struct ApiKeys {
    digests: Arc<Vec<[u8; 32]>>,
    outbound: Option<Secret>,
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    /// The keys of `--api-key` and `--api-key-file`.
    pub fn load(args: &AuthArgs) -> Result<ApiKeys, String> {
        let mut keys: Vec<String> = args.api_key.iter().map(|s| s.0.clone()).collect();
        if let Some(path) = &args.api_key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --api-key-file {}: {e}", path.display()))?;
            let before = keys.len();
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_string),
            );
            if keys.len() == before {
                return Err(format!("--api-key-file {} holds no key", path.display()));
            }
        }
        Ok(ApiKeys::new(keys))
    }

    /// Accepts `keys` and sends the first.
    pub fn new(keys: Vec<String>) -> ApiKeys {
        ApiKeys {
            digests: Arc::new(keys.iter().map(|k| digest(k)).collect()),
            outbound: keys.into_iter().next().map(Secret),
        }
    }

    /// How many keys are accepted (0: the server is open).
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// True when no key is needed.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Which key (its position) an `Authorization` value names; every key is compared, whatever
    /// matched first.
    pub fn check(&self, authorization: Option<&str>) -> Result<usize, AuthFailure> {
        let token = authorization
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or(AuthFailure::Missing)?;
        let presented = digest(token);
        let mut found = None;
        for (i, known) in self.digests.iter().enumerate() {
            if bool::from(known.ct_eq(&presented)) && found.is_none() {
                found = Some(i);
            }
        }
        found.ok_or(AuthFailure::Wrong)
    }

    /// The `Authorization` value to send to a server that needs this server's first key.
    pub fn bearer(&self) -> Option<String> {
        self.outbound_key().map(|key| format!("Bearer {key}"))
    }

    /// The first key itself, for this server's own worker processes to accept.
    pub fn outbound_key(&self) -> Option<&str> {
        self.outbound.as_ref().map(|s| s.0.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_by_its_bearer_header_and_nothing_else_passes() {
        let keys = ApiKeys::new(vec!["first".into(), "second".into()]);
        assert_eq!(keys.check(Some("Bearer second")), Ok(1));
        assert_eq!(keys.check(Some("bearer first")), Ok(0));
        assert_eq!(keys.check(Some("Bearer third")), Err(AuthFailure::Wrong));
        assert_eq!(keys.check(Some("Bearer secon")), Err(AuthFailure::Wrong));
        assert_eq!(keys.check(Some("Basic first")), Err(AuthFailure::Missing));
        assert_eq!(keys.check(Some("first")), Err(AuthFailure::Missing));
        assert_eq!(keys.check(None), Err(AuthFailure::Missing));
        assert_eq!(keys.bearer().as_deref(), Some("Bearer first"));
    }

    #[test]
    fn keys_never_print() {
        let keys = ApiKeys::new(vec!["hunter2".into()]);
        let args = AuthArgs {
            api_key: vec![secret("hunter2").unwrap()],
            api_key_file: None,
        };
        assert!(!format!("{keys:?} {args:?}").contains("hunter2"));
    }

    #[test]
    fn a_key_file_adds_its_lines_and_an_empty_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("tulip-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        std::fs::write(&file, "# team keys\nalpha\n\n beta \n").unwrap();
        let args = AuthArgs {
            api_key: vec![secret("cli").unwrap()],
            api_key_file: Some(file.clone()),
        };
        let keys = ApiKeys::load(&args).unwrap();
        assert_eq!(keys.len(), 3);
        assert_eq!(keys.check(Some("Bearer beta")), Ok(2));
        std::fs::write(&file, "# nothing\n").unwrap();
        assert!(ApiKeys::load(&args).unwrap_err().contains("holds no key"));
    }
}
