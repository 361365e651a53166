"""Request bodies of the OpenAI chat-completions API, validated with pydantic (unknown fields are
accepted and ignored, as OpenAI clients send extras)."""
from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: Union[str, Dict[str, Any]] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: Optional[str] = None
    type: str = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, List[Dict[str, Any]], None] = None
    name: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None
    tool_call_id: Optional[str] = None

    @model_validator(mode="after")
    def _content_present(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if isinstance(self.content, list):
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts are supported")
        return self


# OpenAI's rule for function names: they are written verbatim into the forced-call grammar and the reply
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
MAX_SEED = 2 ** 63  # the engine takes an unsigned 64-bit seed; bounded here so a bad one fails before prefill


def _check_type(where: str, t) -> None:
    types = t if isinstance(t, list) else [t]
    if not types or any(not isinstance(x, str) or x not in JSON_TYPES for x in types):
        raise ValueError(f"{where}: 'type' must be one of {list(JSON_TYPES)} or a list of them, got {t!r}")


def check_parameters(name: str, parameters: Dict[str, Any]) -> None:
    """The parts of a function's JSON schema the server reads (``type``, ``properties``, ``required``,
    ``enum``) must have their JSON Schema shapes; anything else in it is passed through untouched."""
    where = f"tool {name!r}: parameters"
    if "type" in parameters:
        _check_type(where, parameters["type"])
    props = parameters.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise ValueError(f"{where}.properties must be an object mapping names to schemas, "
                             f"got {type(props).__name__}")
        for key, sub in props.items():
            if not isinstance(sub, dict):
                raise ValueError(f"{where}.properties.{key} must be a schema object, got {type(sub).__name__}")
            if "type" in sub:
                _check_type(f"{where}.properties.{key}", sub["type"])
            if "enum" in sub and not isinstance(sub["enum"], list):
                raise ValueError(f"{where}.properties.{key}.enum must be a list, got {type(sub['enum']).__name__}")
    req = parameters.get("required")
    if req is not None and (not isinstance(req, list) or any(not isinstance(x, str) for x in req)):
        raise ValueError(f"{where}.required must be a list of property names, got {req!r}")


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=NAME_PATTERN)
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None

    @model_validator(mode="after")
    def _schema_shape(self):
        if self.parameters is not None:
            check_parameters(self.name, self.parameters)
        return self


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: ToolFunction


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: Dict[str, str]

    @field_validator("function")
    @classmethod
    def _has_name(cls, v):
        if not v.get("name"):
            raise ValueError("tool_choice.function.name is required")
        return v


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Optional[str] = None
    messages: List[Message] = Field(min_length=1)
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    # llama-server's and vLLM's extras (0 or null: off); strict: true or "5" is not a k
    top_k: Optional[StrictInt] = Field(default=None, ge=0, le=2 ** 31 - 1)
    min_p: Optional[float] = Field(default=None, ge=0.0, lt=1.0)
    seed: Optional[int] = Field(default=None, ge=0, lt=MAX_SEED)
    stop: Union[str, List[str], None] = None
    stream: StrictBool = False  # 1 or "yes" is refused, not read as true
    stream_options: Optional[StreamOptions] = None
    tools: Optional[List[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    n: int = 1
    user: Optional[str] = None
    logprobs: Optional[bool] = None
    response_format: Optional[Dict[str, Any]] = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list):
            if len(v) > 4:
                raise ValueError("at most 4 stop sequences")
            if any(not s for s in v):
                raise ValueError("stop sequences must be non-empty")
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v):
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v):
        if v:
            raise ValueError("logprobs are not supported")
        return v

    @field_validator("response_format")
    @classmethod
    def _format(cls, v):
        if v is not None and v.get("type", "text") != "text":
            raise ValueError("only response_format type 'text' is supported")
        return v

    @model_validator(mode="after")
    def _tool_choice_needs_tools(self):
        named = isinstance(self.tool_choice, NamedToolChoice)
        if (named or self.tool_choice == "required") and not self.tools:
            raise ValueError("tool_choice requires tools")
        if named and self.tool_choice.function["name"] not in {t.function.name for t in self.tools}:
            raise ValueError(f"tool_choice names an unknown tool {self.tool_choice.function['name']!r}")
        return self

    # --------------------------------------------------------------- plain values for the session
    def stop_list(self) -> List[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def token_budget(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def tool_dicts(self) -> Optional[List[dict]]:
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def forced_tool(self) -> Optional[str]:
        """The tool the reply must call: its name, ``"*"`` for any (``required``), or None."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function["name"]
        return "*" if self.tool_choice == "required" else None
