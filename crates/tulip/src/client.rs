//! A client of Tulip's gRPC contract, used by Ivy and by the Python `tulip.Client`.

use tonic::transport::{Channel, Endpoint};

use crate::error::TulipError;
use crate::proto;
use crate::proto::tulip_client::TulipClient as RawClient;
use crate::server::MAX_MESSAGE_BYTES;

/// A cheap-to-clone connection to one Tulip server.
#[derive(Clone)]
pub struct TulipClient {
    raw: RawClient<Channel>,
}

impl TulipClient {
    /// Connects lazily to `url` (e.g. `http://127.0.0.1:50051`).
    pub fn new(url: &str) -> Result<TulipClient, TulipError> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| TulipError::Validation(format!("bad Tulip address {url}: {e}")))?
            .tcp_nodelay(true);
        let raw = RawClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(TulipClient { raw })
    }

    /// Embeds tokenized sequences.
    pub async fn embed(
        &self,
        request: proto::EmbedRequest,
    ) -> Result<proto::EmbedResponse, TulipError> {
        Ok(self.raw.clone().embed(request).await?.into_inner())
    }

    /// Describes the served model.
    pub async fn info(&self) -> Result<proto::InfoResponse, TulipError> {
        Ok(self
            .raw
            .clone()
            .info(proto::InfoRequest {})
            .await?
            .into_inner())
    }

    /// True when the server answers and its engine runs.
    pub async fn health(&self) -> Result<bool, TulipError> {
        Ok(self
            .raw
            .clone()
            .health(proto::HealthRequest {})
            .await?
            .into_inner()
            .ready)
    }

    /// The model's tokenizer and tokenization settings.
    pub async fn tokenizer(&self) -> Result<proto::TokenizerResponse, TulipError> {
        Ok(self
            .raw
            .clone()
            .tokenizer(proto::TokenizerRequest {})
            .await?
            .into_inner())
    }
}
