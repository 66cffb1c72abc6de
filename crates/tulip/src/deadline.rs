//! A caller's gRPC deadline (the `grpc-timeout` header), so that a call past it is answered
//! DEADLINE_EXCEEDED and its sequences leave the queue before they reach the engine.

use std::future::Future;
use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::Status;

/// The `grpc-timeout` value's duration: up to 8 digits and a unit (H, M, S, m, u, n), as the
/// gRPC over HTTP/2 protocol writes it; None when absent or malformed.
pub fn parse(value: &str) -> Option<Duration> {
    if !value.is_ascii() {
        return None;
    }
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The deadline a call's metadata carries.
pub fn of(metadata: &MetadataMap) -> Option<Duration> {
    parse(metadata.get("grpc-timeout")?.to_str().ok()?)
}

/// `work`, bounded by `limit` when there is one; dropping it at the deadline drops its sequences.
pub async fn within<T>(
    limit: Option<Duration>,
    work: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let Some(limit) = limit else {
        return work.await;
    };
    match tokio::time::timeout(limit, work).await {
        Ok(answer) => answer,
        Err(_) => {
            metrics::counter!("tulip_deadline_exceeded_total").increment(1);
            Err(Status::deadline_exceeded(format!(
                "the call's deadline ({limit:?}) passed before its sequences were computed"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_read_as_the_protocol_writes_them() {
        assert_eq!(parse("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "m", "123456789m", "10x", "-1S", "1.5S", "é"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn work_past_its_deadline_is_dropped_and_answered_deadline_exceeded() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, Status>(1)
        };
        let late = within(Some(Duration::from_millis(10)), slow).await;
        assert_eq!(late.unwrap_err().code(), tonic::Code::DeadlineExceeded);
        assert_eq!(within(None, async { Ok::<_, Status>(2) }).await.unwrap(), 2);
    }
}
