"""A (query, document) pair through the model's chat template, as sentence-transformers 6 renders it
for a CrossEncoder whose Transformer takes messages (an LLM reranker: Qwen3-Reranker, mxbai-rerank-v2).

sentence-transformers (base/modality.py, base/modules/transformer.py) makes a pair two messages,
`{"role": "query", "content": q}` and `{"role": "document", "content": d}` (content a list of one
`{"type": "text", "text": ...}` in the "structured" message format), puts a system message with the
prompt first when there is one, and renders them with transformers' `apply_chat_template`: the
template in the Jinja sandbox transformers uses (`trim_blocks`, `lstrip_blocks`, loop controls,
`tojson`, `raise_exception`), the tokenizer's special tokens as variables, no generation prompt,
then tokenized without special tokens.

Rendering Jinja per pair would cost what the tokenizer costs, so the template is rendered once per
system prompt, with a marker for each content, and cut there into three fixed texts around the two
contents (`PairPieces`). That holds for a template that writes each content once and as it is,
which is what the published reranker templates do; one that transforms or repeats a content, or
leaves it out, is refused with the reason (two probe pairs rendered in full must equal the pieces'
assembly). Rendering needs jinja2; it is imported only when a directory has such a template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

_QUERY, _DOCUMENT = "\x00kembed-query\x00", "\x00kembed-document\x00"
# Contents the check renders in full, beside the markers: spacing, newlines, braces and a quote.
_PROBES = (("what is  kembed?\n", " {a} 'b'"), ("Q", "D\n\n end"))


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A directory's chat template and what rendering it takes (all read at start)."""

    source: str  # the Jinja text
    file: str  # where it was read: chat_template.jinja or tokenizer_config.json
    message_format: str = "flat"  # "flat": content is the text; "structured": [{"type": "text", ...}]
    variables: dict[str, Any] = field(default_factory=dict)  # the special tokens, then the saved kwargs
    restore_suffix: bool = True  # truncation keeps the template's tail (sentence-transformers' default)

    def pieces(self, system: str | None) -> PairPieces:
        """The fixed texts around a pair's two contents with `system` as the system message (None:
        no system message, as sentence-transformers renders without a prompt); ValueError for a
        template whose contents are not written once each, as they are."""
        rendered = self._checked_render(_QUERY, _DOCUMENT, system)
        at = {role: rendered.find(marker) for role, marker in (("query", _QUERY), ("document", _DOCUMENT))}
        for role, marker in (("query", _QUERY), ("document", _DOCUMENT)):
            if rendered.count(marker) != 1:
                times = "does not write" if at[role] < 0 else "writes more than once"
                raise ValueError(f"the chat template ({self.file}) {times} the {role}: kembed serves a "
                                 "template that writes each of a pair's query and document once")  # fmt: skip
        first = min(at, key=at.__getitem__)
        head, rest = rendered.split(_QUERY if first == "query" else _DOCUMENT)
        middle, tail = rest.split(_DOCUMENT if first == "query" else _QUERY)
        pieces = PairPieces((head, middle, tail), first == "query")
        for query, document in _PROBES:
            if self._checked_render(query, document, system) != pieces.join(query, document):
                raise ValueError(
                    f"the chat template ({self.file}) changes a pair's content as it writes it: kembed "
                    "serves a template that writes the query and the document as they are"
                )
        return pieces

    def _checked_render(self, query: str, document: str, system: str | None) -> str:
        try:
            return self.render(query, document, system)
        except Exception as error:  # a template error, or one the template raises itself
            raise ValueError(f"the chat template ({self.file}) does not render a pair: {error}") from None

    def render(self, query: str, document: str, system: str | None) -> str:
        """The pair as transformers' apply_chat_template renders it (tokenize=False)."""
        messages = [] if system is None else [self._message("system", system)]
        messages += [self._message("query", query), self._message("document", document)]
        return str(
            _compiled(self.source).render(
                **self.variables, messages=messages, tools=None, documents=None, add_generation_prompt=False
            )
        )

    def _message(self, role: str, text: str) -> dict[str, Any]:
        if self.message_format == "structured":
            return {"role": role, "content": [{"type": "text", "text": text}]}
        return {"role": role, "content": text}


@dataclass(frozen=True, slots=True)
class PairPieces:
    """A rendered pair's fixed texts: `texts[0]` first content `texts[1]` second content `texts[2]`."""

    texts: tuple[str, str, str]
    is_query_first: bool

    def join(self, query: str, document: str) -> str:
        first, second = (query, document) if self.is_query_first else (document, query)
        return f"{self.texts[0]}{first}{self.texts[1]}{second}{self.texts[2]}"


def read_chat_template(
    transformer_dir: Path, sbert: dict[str, Any], tokenizer_config: dict[str, Any]
) -> ChatTemplate | None:
    """The chat template sentence-transformers renders an LLM reranker's pairs with, or None: only a
    causal LM's Transformer (`transformer_task: text-generation`) whose `modality_config`
    (sentence_bert_config.json) takes messages does (sentence-transformers 6 writes it so when the
    tokenizer has a template; a directory saved before it, without modality_config, takes text
    alone). ValueError when it takes messages but the directory has no template.

    An embedder saved so (feature-extraction with messages) has its texts rendered through the
    template by sentence-transformers 6 too; kembed tokenizes texts as they are, so
    model_files.load_model_spec refuses such a directory before this is read."""
    if sbert.get("transformer_task") != "text-generation" or "message" not in (
        sbert.get("modality_config") or {}
    ):
        return None
    file = transformer_dir / "chat_template.jinja"
    if file.is_file():
        source, where = file.read_text(encoding="utf-8"), file.name
    else:
        source, where = _template_in(tokenizer_config), "tokenizer_config.json"
    if not source:
        raise ValueError(
            f"{transformer_dir}: sentence_bert_config.json renders inputs as chat messages, but the "
            "directory has no chat template (chat_template.jinja or tokenizer_config.json chat_template)"
        )
    message_format = str((sbert["modality_config"]["message"] or {}).get("format", "flat"))
    kwargs = dict((sbert.get("processing_kwargs") or {}).get("chat_template") or {})
    restore_suffix = bool(kwargs.pop("restore_suffix", True))
    for size_key in ("padding", "truncation", "max_length", "return_tensors"):  # not the template's
        kwargs.pop(size_key, None)
    variables = {**_special_tokens(tokenizer_config), **kwargs}
    return ChatTemplate(source, where, message_format, variables, restore_suffix)


def _template_in(tokenizer_config: dict[str, Any]) -> str:
    """tokenizer_config.json's `chat_template`: a string, or named templates (the "default" one)."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {str(t.get("name")): str(t.get("template", "")) for t in template if isinstance(t, dict)}
        return named.get("default", "")
    return template if isinstance(template, str) else ""


def _special_tokens(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    """The tokenizer's special tokens by name (`eos_token`, ...), the variables transformers gives
    every template."""
    names = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
    tokens = {}
    for name in names:
        token = tokenizer_config.get(name)
        if isinstance(token, dict):  # an AddedToken as saved: {"content": ...}
            token = token.get("content")
        if isinstance(token, str):
            tokens[name] = token
    return tokens


_COMPILED: dict[str, Any] = {}


def _compiled(source: str) -> Any:
    """The template compiled in a sandbox as transformers compiles chat templates (templates come
    from the Hub: untrusted code). jinja2 >= 3.1.6, as transformers requires (older ones have known
    sandbox escapes)."""
    if source not in _COMPILED:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        environment.filters["tojson"] = tojson
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
        _COMPILED[source] = environment.from_string(source)
    return _COMPILED[source]
