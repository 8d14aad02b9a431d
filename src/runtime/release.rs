//! What the runtime needs of a release, loaded once per release: the
//! manifest, the compiled output contract and the tools' input schemas.

use std::collections::HashMap;

use serde_json::Value;

use super::RuntimeError;
use crate::domain::access::TenantScope;
use crate::domain::release::{LoadedRelease, Manifest, ToolDescriptor};
use crate::domain::{DomainError, FieldError};
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

/// Refuses `input` when the manifest declares an input schema it does not
/// satisfy, naming each field at fault below `inputJson`.
pub fn check_input(manifest: &Manifest, input: &Value) -> Result<(), DomainError> {
    let Some(schema) = &manifest.input_schema else {
        return Ok(());
    };
    let validator = jsonschema::validator_for(schema).map_err(|e| {
        DomainError::FailedPrecondition(format!(
            "the input schema of release {} is not a usable JSON Schema: {e}",
            manifest.release_id
        ))
    })?;
    unfit(
        "inputJson",
        format!("the input schema of release {}", manifest.release_id),
        &validator,
        input,
    )
}

/// Refuses a document the validator does not pass: each field at fault
/// named as a dotted path below `what` (`inputJson.customer`), a missing
/// property by its own name.
pub fn unfit(
    what: &str,
    schema: String,
    validator: &jsonschema::Validator,
    document: &Value,
) -> Result<(), DomainError> {
    use jsonschema::error::ValidationErrorKind;
    const MAX_LISTED: usize = 20;
    let violations: Vec<FieldError> = validator
        .iter_errors(document)
        .take(MAX_LISTED)
        .map(|e| {
            let mut path: Vec<String> = e
                .instance_path()
                .to_string()
                .split('/')
                .filter(|p| !p.is_empty())
                .map(|p| p.replace("~1", "/").replace("~0", "~"))
                .collect();
            let reason = match e.kind() {
                ValidationErrorKind::Required { property } => {
                    path.push(property.as_str().unwrap_or_default().to_string());
                    "is required".to_string()
                }
                _ => e.to_string(),
            };
            let field = std::iter::once(what.to_string())
                .chain(path)
                .collect::<Vec<_>>()
                .join(".");
            FieldError::new(field, reason)
        })
        .collect();
    if violations.is_empty() {
        return Ok(());
    }
    Err(DomainError::Unfit {
        what: what.to_string(),
        schema,
        violations,
    })
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
