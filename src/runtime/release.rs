//! What the runtime needs of a release, loaded once per release: the
//! manifest, the compiled output contract and the tools' input schemas.

use std::collections::HashMap;

use serde_json::Value;

use super::RuntimeError;
use crate::domain::DomainError;
use crate::domain::access::TenantScope;
use crate::domain::release::{LoadedRelease, Manifest, ToolDescriptor};
use crate::releases::Releases;

/// A release as the runtime uses it.
pub struct ReleaseInfo {
    /// The verified release.
    pub release: LoadedRelease,
    /// Its manifest.
    pub manifest: Manifest,
    /// The output contract.
    output: jsonschema::Validator,
    /// Tools by id, with their compiled input schemas.
    tools: HashMap<String, (ToolDescriptor, jsonschema::Validator)>,
    /// Workflow step names.
    pub steps: Vec<String>,
}

/// Why the arguments of a call of `tool` do not fit its input schema, if
/// they do not.
pub fn argument_mismatch(
    validator: &jsonschema::Validator,
    tool: &str,
    arguments: &Value,
) -> Option<String> {
    let problems = violations(validator, arguments);
    (!problems.is_empty()).then(|| {
        format!(
            "the arguments do not match the input schema of tool {tool}: {}",
            problems.join("; ")
        )
    })
}

/// What a JSON Schema said of a document: `<path>: <message>` per error.
pub fn violations(validator: &jsonschema::Validator, document: &Value) -> Vec<String> {
    validator
        .iter_errors(document)
        .map(|e| {
            let path = e.instance_path().to_string();
            let path = if path.is_empty() {
                "/".to_string()
            } else {
                path
            };
            format!("{path}: {e}")
        })
        .collect()
}

fn compile(what: &str, schema: &Value) -> Result<jsonschema::Validator, RuntimeError> {
    jsonschema::validator_for(schema).map_err(|e| {
        DomainError::FailedPrecondition(format!(
            "the release's {what} is not a usable JSON Schema: {e}"
        ))
        .into()
    })
}

impl ReleaseInfo {
    /// Loads a release of the scope's tenant (verified at import; a run
    /// keeps the release it was submitted with even if it is deprecated).
    pub fn load(
        releases: &Releases,
        scope: &TenantScope,
        release_id: &str,
    ) -> Result<ReleaseInfo, RuntimeError> {
        let release = releases
            .get(scope, release_id)?
            .ok_or_else(|| DomainError::not_found("release", release_id))?;
        let manifest = releases.manifest(scope, &release)?;
        let contract: Value =
            serde_json::from_slice(&releases.artifact(scope, &release, "outputContract")?)
                .map_err(|e| {
                    DomainError::FailedPrecondition(format!(
                        "the release's output contract is not JSON: {e}"
                    ))
                })?;
        let output = compile("output contract", &contract)?;
        let mut tools = HashMap::new();
        for tool in &manifest.tools {
            let validator = compile(
                &format!("input schema of tool {}", tool.id),
                &tool.input_schema,
            )?;
            tools.insert(tool.id.clone(), (tool.clone(), validator));
        }
        let workflow = releases.artifact(scope, &release, "workflow")?;
        let steps = crate::domain::release::workflow_steps(&workflow, &release.agent_id);
        Ok(ReleaseInfo {
            release,
            manifest,
            output,
            tools,
            steps,
        })
    }

    /// Violations of the output contract.
    pub fn check_output(&self, output: &Value) -> Vec<String> {
        violations(&self.output, output)
    }

    /// A tool of the closure with its schema check.
    pub fn tool(&self, id: &str) -> Option<(&ToolDescriptor, &jsonschema::Validator)> {
        self.tools.get(id).map(|(t, v)| (t, v))
    }

    /// Ids of the closure, for messages.
    pub fn tool_ids(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self.tools.keys().map(String::as_str).collect();
        ids.sort();
        ids
    }
}
