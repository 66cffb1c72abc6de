//! Tulip's gRPC codec: prost's, except that a message that does not decode is answered
//! INVALID_ARGUMENT (the sender's mistake), where tonic's prost codec answers INTERNAL.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The codec of every Tulip RPC (build.rs names it to tonic-prost-build).
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(ProstDecoder::new(BufferSettings::default()))
    }
}

/// prost's decoder with its failures mapped to INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct StrictDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0
            .decode(src)
            .map_err(|status| Status::invalid_argument(status.message().to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
