pub mod clock;
pub mod domain;
pub mod store;

/// Code generated from the `.proto` files under `static/proto/`.
pub mod proto {
    connectrpc::include_generated!();
}
