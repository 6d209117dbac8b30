//! The MCP server's side of the protocol: rmcp's `ServerHandler` for
//! [`Door`] (initialize, the tools, the `inbox://` resource and its
//! subscriptions), turning each request into the door's calls in `mod.rs`.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CustomRequest, CustomResult, ErrorCode,
    Implementation, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig, SubscribeRequestParams, Tool,
    ToolAnnotations, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

use super::{Door, resource, tools};

/// The one resource; any other URI is -32002 (MCP's "resource not found").
fn known_uri(uri: &str) -> Result<(), ErrorData> {
    if uri == resource::URI {
        return Ok(());
    }
    Err(ErrorData::resource_not_found(
        format!(
            "no resource '{}'; lw-mcp serves {} (see resources/list)",
            base::visible::visible(uri),
            resource::URI
        ),
        None,
    ))
}

/// Decodes a tool's arguments; a mismatch is -32602 naming the problem.
fn args<T: serde::de::DeserializeOwned>(
    tool: &str,
    a: Option<serde_json::Map<String, Value>>,
) -> Result<T, ErrorData> {
    serde_json::from_value(Value::Object(a.unwrap_or_default())).map_err(|e| {
        ErrorData::invalid_params(
            format!("invalid arguments for tool '{tool}': {e}; see its inputSchema in tools/list"),
            None,
        )
    })
}

impl ServerHandler for Door {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .build(),
        )
        .with_server_info(
            Implementation::new("lw-mcp", env!("CARGO_PKG_VERSION"))
                .with_title("loopwright mailbox"),
        )
        .with_instructions(
            "The loopwright mailbox of this sandbox: the only way to reach other sandboxes \
                 and people. post sends a message through the mediator; inbox, show and ack read \
                 what was delivered to you; wait blocks until something arrives; whoami names \
                 you and your peers. The resource inbox:// holds your unread messages; subscribe \
                 to it to be told when one arrives.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = tools::specs(&mailbox::post::postable_kinds())
            .into_iter()
            .map(|s| {
                let schema = match s.schema {
                    Value::Object(o) => o,
                    _ => unreachable!("every tool schema is a JSON object"),
                };
                let mut t = Tool::new(s.name, s.description, schema);
                t.title = Some(s.title.to_string());
                let mut ann = ToolAnnotations::default();
                ann.read_only_hint = Some(s.read_only);
                ann.destructive_hint = Some(false);
                ann.open_world_hint = Some(false);
                t.annotations = Some(ann);
                t
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!(
                "method not found: {}; lw-mcp serves initialize, ping, tools/list, tools/call, \
                 resources/list, resources/read, resources/subscribe and resources/unsubscribe",
                base::visible::visible(&request.method)
            ),
            None,
        ))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let r = Resource::new(resource::URI, "inbox")
            .with_title("Inbox")
            .with_description(
                "The messages delivered to this sandbox and not yet acknowledged (JSON). \
                 Subscribe to be notified when one arrives.",
            )
            .with_mime_type("application/json");
        Ok(ListResourcesResult::with_all_items(vec![r]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        known_uri(&request.uri)?;
        let v = self
            .read_inbox()
            .map_err(|m| ErrorData::internal_error(m, None))?;
        let text = serde_json::to_string_pretty(&v).expect("plain JSON serialises");
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(text, resource::URI).with_mime_type("application/json"),
        ])
        .into())
    }

    #[allow(deprecated)] // the 2025 protocols' subscription, which lw-mcp speaks
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        known_uri(&request.uri)?;
        self.subscribe_inbox(context.peer)
            .map_err(|m| ErrorData::internal_error(m, None))
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        known_uri(&request.uri)?;
        self.unsubscribe_inbox();
        Ok(())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let a = request.arguments;
        let r = match request.name.as_ref() {
            "post" => self.post(args("post", a)?).await,
            "inbox" => self.inbox(args("inbox", a)?),
            "show" => self.show(args("show", a)?),
            "ack" => self.ack(args("ack", a)?).await,
            "wait" => self.wait(args("wait", a)?, &context).await,
            "whoami" => {
                args::<tools::NoArgs>("whoami", a)?;
                self.whoami()
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "unknown tool '{}'; the tools are post, inbox, show, ack, wait, whoami",
                        base::visible::visible(other)
                    ),
                    None,
                ));
            }
        };
        Ok(r.into())
    }
}
