//! Compiles the `.proto` contract under `static/proto/` with protox (pure
//! Rust, offline) and generates message types and service traits with
//! connectrpc-build. It also writes `rpc_methods.rs`, the list of every RPC
//! method with its streaming shape, which `/openapi.json` publishes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prost::Message as _;

fn main() {
    let proto_root = Path::new("static/proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let mut files = Vec::new();
    collect_protos(proto_root, &mut files);
    files.sort();
    let relative: Vec<String> = files
        .iter()
        .map(|f| {
            f.strip_prefix(proto_root)
                .expect("under the proto root")
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();

    let mut compiler = protox::Compiler::new([proto_root]).expect("proto include path");
    compiler.include_source_info(true).include_imports(true);
    for file in &relative {
        compiler
            .open_file(file)
            .unwrap_or_else(|e| panic!("compiling {file}: {e}"));
    }
    let set = compiler.file_descriptor_set();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let descriptor_path = out_dir.join("agentbay_descriptor.bin");
    std::fs::write(&descriptor_path, set.encode_to_vec()).expect("write descriptor set");
    std::fs::write(out_dir.join("rpc_methods.rs"), rpc_method_table(&set))
        .expect("write rpc table");

    connectrpc_build::Config::new()
        .descriptor_set(&descriptor_path)
        .files(&relative)
        .include_file("_connectrpc.rs")
        .compile()
        .expect("generate RPC code");
}

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read proto dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            collect_protos(&path, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
}

/// Renders `pub const RPC_METHODS: &[RpcMethod]` from the descriptors, so
/// the published method list can never drift from the contract.
fn rpc_method_table(set: &prost_types::FileDescriptorSet) -> String {
    let mut out = String::from("&[\n");
    for file in &set.file {
        if !file.name().starts_with("agentbay/") {
            continue;
        }
        let comments = leading_comments(file);
        for (si, service) in file.service.iter().enumerate() {
            for (mi, method) in service.method.iter().enumerate() {
                let doc = comments
                    .get(&vec![6, si as i32, 2, mi as i32])
                    .cloned()
                    .unwrap_or_default();
                writeln!(
                    out,
                    "    RpcMethod {{ service: {:?}, method: {:?}, input: {:?}, output: {:?}, server_streaming: {}, client_streaming: {}, doc: {:?} }},",
                    format!("{}.{}", file.package(), service.name()),
                    method.name(),
                    method.input_type().trim_start_matches('.'),
                    method.output_type().trim_start_matches('.'),
                    method.server_streaming(),
                    method.client_streaming(),
                    doc.trim(),
                )
                .expect("write to string");
            }
        }
    }
    out.push(']');
    out
}

fn leading_comments(
    file: &prost_types::FileDescriptorProto,
) -> std::collections::HashMap<Vec<i32>, String> {
    file.source_code_info
        .as_ref()
        .map(|info| {
            info.location
                .iter()
                .filter_map(|l| {
                    l.leading_comments
                        .as_ref()
                        .map(|c| (l.path.clone(), c.replace('\n', " ").trim().to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}
