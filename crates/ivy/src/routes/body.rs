//! The JSON body extractor every route uses: its rejections answered in Ivy's error format.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::Json;
use serde::de::DeserializeOwned;

use crate::error::IvyError;
use crate::gateway::Gateway;

/// A JSON body whose rejections are answered in Ivy's error format.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Gateway> for JsonBody<T> {
    type Rejection = IvyError;

    async fn from_request(req: Request, state: &Gateway) -> Result<Self, IvyError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(JsonBody(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(IvyError::UnsupportedMediaType),
            Err(JsonRejection::JsonSyntaxError(e)) => Err(IvyError::InvalidJson(e.body_text())),
            Err(JsonRejection::JsonDataError(e)) => Err(IvyError::Validation(e.body_text())),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(IvyError::TooLarge(format!(
                "the request body is larger than this server's limit of {} bytes (--payload-limit)",
                state.args().payload_limit
            )))
            }
            Err(e) => Err(IvyError::InvalidJson(e.body_text())),
        }
    }
}
