//! The Connect RPC conventions: both codecs, gRPC on the same port, unary
//! and server streaming.

use std::time::Duration;

use agentbay::proto::agentbay::admin::v1 as pb;
use connectrpc::{CodecFormat, ErrorCode, Protocol};

use crate::common::Appliance;

#[tokio::test]
async fn the_same_method_answers_json_binary_and_grpc() {
    let a = Appliance::start();
    let token = a.admin_token().await;
    for (codec, protocol) in [
        (CodecFormat::Json, Protocol::Connect),
        (CodecFormat::Proto, Protocol::Connect),
        (CodecFormat::Proto, Protocol::Grpc),
        (CodecFormat::Proto, Protocol::GrpcWeb),
    ] {
        let version = a
            .rpc_with(&token, codec, protocol)
            .get_version(pb::GetVersionRequest::default())
            .await
            .unwrap_or_else(|e| panic!("{codec:?} over {protocol:?}: {e:?}"))
            .into_owned();
        assert_eq!(version.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(version.certificate_fingerprint, a.fingerprint);
        assert_eq!(version.caller_tenant_id, "platform");
        assert_eq!(version.schema_version, agentbay::store::SCHEMA_VERSION);
    }
}

#[tokio::test]
async fn connect_json_is_proto3_json_on_the_wire() {
    let a = Appliance::start();
    a.ensure_tenant("acme").await;
    let token = a.admin_token().await;
    let response = a
        .http()
        .post(format!("{}/agentbay.admin.v1.Admin/CreateClient", a.url))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(r#"{"tenantId":"acme","scopes":["factory.runs.read"],"description":"raw json"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["client"]["tenantId"], "acme");
    assert_eq!(body["client"]["description"], "raw json");
    assert!(body["clientSecret"].as_str().unwrap().starts_with("abs_"));
    // Unset fields are omitted, as proto3 JSON says.
    assert!(body["client"].get("revokedAt").is_none());

    let bad = a
        .http()
        .post(format!("{}/agentbay.admin.v1.Admin/CreateClient", a.url))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(r#"{"tenantId":"Not A Slug","scopes":["factory.runs.read"]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body: serde_json::Value = bad.json().await.unwrap();
    assert_eq!(body["code"], "invalid_argument");
    assert!(
        body["message"].as_str().unwrap().contains("tenantId"),
        "{body}"
    );
}

#[tokio::test]
async fn watch_events_streams_history_then_live_events_in_both_codecs() {
    let a = Appliance::start();
    let token = a.admin_token().await;
    a.create_client("acme", &["factory.runs.read"]).await;
    for codec in [CodecFormat::Json, CodecFormat::Proto] {
        let rpc = a.rpc_with(&token, codec, Protocol::Connect);
        let mut stream = rpc
            .watch_events(pb::WatchEventsRequest {
                after_sequence: 0,
                topics: vec!["agentbay.admin.v1.client-created".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        let first = stream.message().await.unwrap().unwrap().to_owned_message();
        assert_eq!(first.tenant_id, "platform");
        let second = stream.message().await.unwrap().unwrap().to_owned_message();
        assert_eq!(second.tenant_id, "acme");
        let payload = second.payload.as_option().unwrap();
        assert_eq!(payload.fields["tenantId"].as_str(), Some("acme"));

        // A live one arrives after whatever history remains.
        let created = a.create_client("globex", &["factory.runs.read"]).await;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(10), stream.message())
                .await
                .expect("the live event within 10 s")
                .unwrap()
                .unwrap()
                .to_owned_message();
            assert!(next.sequence > second.sequence);
            if next.payload.as_option().unwrap().fields["clientId"].as_str()
                == Some(created.id.as_str())
            {
                break;
            }
        }
    }
}

#[tokio::test]
async fn unknown_methods_are_refused() {
    let a = Appliance::start();
    let token = a.admin_token().await;
    let response = a
        .http()
        .post(format!("{}/agentbay.admin.v1.Admin/DropTables", a.url))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(
        response.status() == 404 || response.status() == 403,
        "{}",
        response.status()
    );
    let err = a
        .rpc_json(&token)
        .backup(pb::BackupRequest::default())
        .await;
    // A streaming method with the right scope works (PlatformAdmin).
    assert!(err.is_ok());
    let reader = a.create_client("acme", &["agentbay.events.read"]).await;
    let reader_token = a.token(&reader).await;
    let denied = a
        .rpc_json(&reader_token)
        .backup(pb::BackupRequest::default())
        .await;
    match denied {
        Err(e) => assert_eq!(e.code, ErrorCode::PermissionDenied),
        Ok(mut stream) => {
            let e = stream.message().await.unwrap_err();
            assert_eq!(e.code, ErrorCode::PermissionDenied);
        }
    }
}
