//! A client of Tulip's gRPC contract, used by Ivy and by the Python `tulip.Client`.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::server::NamedService;
use tonic::transport::{Channel, Endpoint};
use tonic::Request;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::auth::ApiKeys;
use crate::error::TulipError;
use crate::proto;
use crate::proto::tulip_client::TulipClient as RawClient;
use crate::proto::tulip_server::{Tulip, TulipServer};
use crate::scheduler::Scheduler;
use crate::server::{TulipService, MAX_MESSAGE_BYTES};
use crate::trace_context;

/// The clients of one gRPC channel.
#[derive(Clone)]
struct Grpc {
    url: String,
    raw: RawClient<Channel>,
    health: HealthClient<Channel>,
    /// The `authorization` metadata of every Tulip call, for a server that needs a key.
    authorization: Option<MetadataValue<Ascii>>,
}

impl Grpc {
    /// `message` as a call, with the key when there is one and the caller's trace context.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        trace_context::inject(request.metadata_mut());
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        request
    }
}

/// A cheap-to-clone handle on one Tulip server: over gRPC, or in this process.
#[derive(Clone)]
pub struct TulipClient {
    transport: Transport,
}

#[derive(Clone)]
enum Transport {
    Grpc(Box<Grpc>),
    /// The service's own methods, called directly: the same contract without a socket, for a
    /// gateway that runs beside its Tulip (`ivy-serve`), whose queries would otherwise pay a
    /// loopback gRPC round trip each.
    InProcess(TulipService),
}

impl TulipClient {
    /// Connects lazily to `url` (e.g. `http://127.0.0.1:50051`), sending `keys`' key (if any)
    /// with every call.
    pub fn new(url: &str, keys: &ApiKeys) -> Result<TulipClient, TulipError> {
        let authorization = match keys.bearer() {
            Some(value) => Some(
                MetadataValue::try_from(value)
                    .map_err(|_| TulipError::Validation("an API key must be ASCII".into()))?,
            ),
            None => None,
        };
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| TulipError::Validation(format!("bad Tulip address {url}: {e}")))?
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        let health = HealthClient::new(channel.clone());
        let raw = RawClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let url = url.to_string();
        Ok(TulipClient {
            transport: Transport::Grpc(Box::new(Grpc {
                url,
                raw,
                health,
                authorization,
            })),
        })
    }

    /// Serves calls from `scheduler` in this process, as its gRPC server would.
    pub fn in_process(scheduler: Scheduler) -> TulipClient {
        TulipClient {
            transport: Transport::InProcess(TulipService::new(scheduler)),
        }
    }

    /// Where the calls go, for logs.
    pub fn target(&self) -> &str {
        match &self.transport {
            Transport::Grpc(grpc) => &grpc.url,
            Transport::InProcess(_) => "in-process",
        }
    }

    /// Embeds tokenized sequences.
    pub async fn embed(
        &self,
        request: proto::EmbedRequest,
    ) -> Result<proto::EmbedResponse, TulipError> {
        let response = match &self.transport {
            Transport::Grpc(grpc) => grpc.raw.clone().embed(grpc.request(request)).await?,
            Transport::InProcess(service) => service.embed(Request::new(request)).await?,
        };
        Ok(response.into_inner())
    }

    /// Scores tokenized sequences (a score model's).
    /// Several outputs of tokenized sequences from one pass (ModelInfo.outputs says which).
    pub async fn encode(
        &self,
        request: proto::EncodeRequest,
    ) -> Result<proto::EncodeResponse, TulipError> {
        let response = match &self.transport {
            Transport::Grpc(grpc) => grpc.raw.clone().encode(grpc.request(request)).await?,
            Transport::InProcess(service) => service.encode(Request::new(request)).await?,
        };
        Ok(response.into_inner())
    }

    pub async fn score(
        &self,
        request: proto::ScoreRequest,
    ) -> Result<proto::ScoreResponse, TulipError> {
        let response = match &self.transport {
            Transport::Grpc(grpc) => grpc.raw.clone().score(grpc.request(request)).await?,
            Transport::InProcess(service) => service.score(Request::new(request)).await?,
        };
        Ok(response.into_inner())
    }

    /// Describes the served model.
    pub async fn info(&self) -> Result<proto::InfoResponse, TulipError> {
        let message = proto::InfoRequest {};
        let response = match &self.transport {
            Transport::Grpc(grpc) => grpc.raw.clone().info(grpc.request(message)).await?,
            Transport::InProcess(service) => service.info(Request::new(message)).await?,
        };
        Ok(response.into_inner())
    }

    /// The server process's Prometheus metrics, in the text format.
    pub async fn metrics(&self) -> Result<String, TulipError> {
        let message = proto::MetricsRequest {};
        let response = match &self.transport {
            Transport::Grpc(grpc) => grpc.raw.clone().metrics(grpc.request(message)).await?,
            Transport::InProcess(service) => service.metrics(Request::new(message)).await?,
        };
        Ok(response.into_inner().text)
    }

    /// True when the server answers SERVING on the standard health protocol (its engine runs).
    pub async fn health(&self) -> Result<bool, TulipError> {
        match &self.transport {
            Transport::Grpc(grpc) => {
                let request = HealthCheckRequest {
                    service: <TulipServer<TulipService> as NamedService>::NAME.into(),
                };
                let answer = grpc.health.clone().check(request).await?.into_inner();
                Ok(answer.status == ServingStatus::Serving as i32)
            }
            Transport::InProcess(service) => Ok(service.is_ready()),
        }
    }

    /// The model's tokenizer and tokenization settings.
    pub async fn tokenizer(&self) -> Result<proto::TokenizerResponse, TulipError> {
        let message = proto::TokenizerRequest {};
        let response = match &self.transport {
            Transport::Grpc(grpc) => grpc.raw.clone().tokenizer(grpc.request(message)).await?,
            Transport::InProcess(service) => service.tokenizer(Request::new(message)).await?,
        };
        Ok(response.into_inner())
    }
}
