//! `--tulip-endpoint` values: an address (one replica) or a DNS name with one A/AAAA record per
//! replica (a Kubernetes headless Service), re-resolved so that replicas join and leave live.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::http::Uri;
use futures::future::BoxFuture;

use crate::error::IvyError;

/// What one `--tulip-endpoint` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One replica at a fixed address (an IP literal).
    Fixed(String),
    /// Every address `host` resolves to, on `port`.
    Name {
        scheme: String,
        host: String,
        port: u16,
    },
}

impl Target {
    /// Reads `http://host:port` (the port defaults to Tulip's 50051).
    pub fn parse(endpoint: &str) -> Result<Target, IvyError> {
        let bad =
            |why: &str| IvyError::Validation(format!("bad --tulip-endpoint {endpoint}: {why}"));
        let uri: Uri = endpoint.parse().map_err(|_| bad("not a URL"))?;
        let scheme = uri
            .scheme_str()
            .ok_or_else(|| bad("no scheme (http://...)"))?;
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        let port = uri.port_u16().unwrap_or(50051);
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        Ok(match literal.parse::<IpAddr>() {
            Ok(ip) => Target::Fixed(url(scheme, SocketAddr::new(ip, port))),
            Err(_) => Target::Name {
                scheme: scheme.to_string(),
                host: host.to_string(),
                port,
            },
        })
    }
}

/// The URL of one replica.
fn url(scheme: &str, addr: SocketAddr) -> String {
    format!("{scheme}://{addr}")
}

/// Turns a name into addresses: the system's resolver in the server, a scripted one in tests.
pub trait Resolve: Send + Sync + 'static {
    /// Every address `host` has now, on `port`.
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>>;
}

/// getaddrinfo, through tokio (what a Kubernetes pod's /etc/resolv.conf points at).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// The replica URLs a name stands for now, sorted, without repeats.
pub async fn resolve(
    resolver: &dyn Resolve,
    scheme: &str,
    host: &str,
    port: u16,
) -> Result<Vec<String>, IvyError> {
    let addrs = resolver.resolve(host, port).await.map_err(|e| {
        IvyError::Unavailable(format!("cannot resolve the Tulip endpoint {host}: {e}"))
    })?;
    let urls: BTreeSet<String> = addrs.into_iter().map(|a| url(scheme, a)).collect();
    Ok(urls.into_iter().collect())
}

/// What to add and what to remove to go from `current` to `wanted` (pure logic).
pub fn changes(current: &[String], wanted: &[String]) -> (Vec<String>, Vec<String>) {
    let add = wanted
        .iter()
        .filter(|u| !current.contains(u))
        .cloned()
        .collect();
    let remove = current
        .iter()
        .filter(|u| !wanted.contains(u))
        .cloned()
        .collect();
    (add, remove)
}

/// Re-resolves a name every `interval` and hands the answer to `apply`; a failed lookup keeps
/// the replicas as they are (a DNS hiccup is not a replica leaving).
pub async fn watch(
    resolver: Arc<dyn Resolve>,
    (scheme, host, port): (String, String, u16),
    interval: Duration,
    apply: impl Fn(Vec<String>),
) {
    loop {
        tokio::time::sleep(interval).await;
        match resolve(resolver.as_ref(), &scheme, &host, port).await {
            Ok(urls) => apply(urls),
            Err(err) => tracing::warn!("{err}; keeping its replicas as they were"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_fixed_and_names_are_resolved() {
        assert_eq!(
            Target::parse("http://127.0.0.2:7000").unwrap(),
            Target::Fixed("http://127.0.0.2:7000".into())
        );
        assert_eq!(
            Target::parse("http://[::1]:7000").unwrap(),
            Target::Fixed("http://[::1]:7000".into())
        );
        assert_eq!(
            Target::parse("http://tulip.default.svc").unwrap(),
            Target::Name {
                scheme: "http".into(),
                host: "tulip.default.svc".into(),
                port: 50051
            }
        );
        let err = Target::parse("tulip:50051").unwrap_err().to_string();
        assert!(err.contains("tulip:50051"), "{err}");
    }

    #[test]
    fn changes_add_the_new_and_remove_the_gone() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (add, remove) = changes(&s(&["a", "b"]), &s(&["b", "c"]));
        assert_eq!((add, remove), (s(&["c"]), s(&["a"])));
        assert_eq!(changes(&s(&["a"]), &s(&["a"])), (vec![], vec![]));
    }
}
