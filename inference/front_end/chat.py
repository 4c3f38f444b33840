"""vLLM's chat form of /v1/classify: `messages` rendered through the served model's own chat template (transformers'
sandboxed Jinja), then tokenized as rendered: no special tokens or prompt template added unless asked, as vLLM's
chat requests. Called by openai_routes.classify.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

# chat_template_kwargs may not set what the renderer itself is called with
RESERVED = {"conversation", "messages", "tokenize", "chat_template", "return_dict", "tools", "documents"}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    """One chat message (OpenAI's ChatCompletionMessageParam), text only."""

    model_config = ConfigDict(extra="ignore")
    role: StrictStr
    content: StrictStr | list[TextPart]


class ChatFields(BaseModel):
    """vLLM's chat parameters (ChatRequestOptionsMixin in vllm/entrypoints/pooling/base/protocol.py)."""

    messages: list[Message] | None = Field(None, description="Chat messages, rendered by the model's chat template.")
    add_generation_prompt: StrictBool = False
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool | None = Field(None, description="Default: true for `input`, false for `messages`.")
    chat_template: StrictStr | None = Field(None, description="Refused: the model's own chat template renders.")
    chat_template_kwargs: dict | None = None


class ChatRefused(ValueError):
    """Messages the model's chat template cannot render; the route answers it in vLLM's error body."""


def rendered(tokenizer, body: ChatFields) -> str:
    """The messages as the model's chat template writes them; ChatRefused where it cannot."""
    if body.chat_template is not None:
        raise ChatRefused(
            "`chat_template`: a request's own template is not run here; the model's chat template renders"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ChatRefused("this model has no chat template to render `messages`; send `input` instead")
    if body.add_generation_prompt and body.continue_final_message:
        raise ChatRefused("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    extra = {k: v for k, v in (body.chat_template_kwargs or {}).items() if k not in RESERVED}
    messages = [{"role": m.role, "content": _text(m.content)} for m in body.messages or []]
    options = {
        "add_generation_prompt": body.add_generation_prompt,
        "continue_final_message": body.continue_final_message,
    }
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **{**extra, **options})
    except Exception as exc:  # noqa: BLE001 - Jinja's errors (undefined names, raise_exception) are the request's
        why = f"{type(exc).__name__}: {exc}"
        raise ChatRefused(f"`messages`: the model's chat template could not render them ({why:.300})") from None


def _text(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)
