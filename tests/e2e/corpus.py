"""Varied, deterministic test texts: short, over-long, non-English, emoji, code, whitespace-only."""

import random

_WORDS = [
    "search",
    "retrieval",
    "embedding",
    "vector",
    "query",
    "document",
    "ranking",
    "latency",
    "throughput",
    "gateway",
    "worker",
    "token",
    "batch",
    "model",
    "neural",
    "network",
    "semantic",
    "similarity",
    "cosine",
    "index",
    "shard",
    "replica",
    "kubernetes",
    "the",
    "of",
    "and",
    "a",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "be",
    "this",
    "are",
    "or",
    "from",
    "at",
    "an",
]

_FIXED = [
    "hello world",
    "Hello World",
    "a",
    "",
    "   ",
    "\n\t  \n",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "El zorro marrón rápido salta sobre el perro perezoso.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "敏捷的棕色狐狸跳过了懒狗。",
    "素早い茶色の狐がのろまな犬を飛び越える。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "Ο γρήγορος καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "🎉🚀✨ launch day! 🥳",
    "I ❤️ embeddings 😀😃😄😁",
    "👨‍👩‍👧‍👦 family emoji with zero-width joiners",
    "def embed(texts: list[str]) -> np.ndarray:\n    return model.encode(texts, normalize_embeddings=True)",
    "SELECT id, embedding <=> $1 AS distance FROM docs ORDER BY distance LIMIT 10;",
    '{"input": ["a", "b"], "model": "all-MiniLM-L6-v2", "encoding_format": "base64"}',
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "https://example.com/path?query=embedding&limit=10#section",
    "Ünïcödé àccents ñ ç ø å ß œ æ",
    "MiXeD CaSe AND NUMBERS 1234567890 3.14159 -42",
    "tab\tseparated\tvalues\tin\ta\tline",
    "line one\nline two\r\nline three",
    "\u200b zero width space and \u00a0 non-breaking space",
]


def texts(count: int = 240, seed: int = 7) -> list[str]:
    """`count` texts: the fixed edge cases, then random prose of 1 to ~700 words (many past 256 tokens)."""
    rng = random.Random(seed)
    out = list(_FIXED)
    while len(out) < count:
        kind = rng.random()
        if kind < 0.25:
            n = rng.randint(300, 700)  # far past the model's 256-token limit: truncated
        elif kind < 0.5:
            n = rng.randint(60, 200)
        else:
            n = rng.randint(1, 40)
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words) + 1), rng.choice(_FIXED[6:21]))
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ""]))
    return out[:count]


def mixed_lengths(count: int, seed: int = 0, max_words: int = 300) -> list[str]:
    """Prose of uniformly random length, 5 to max_words words: the benchmark's mixed workload."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, max_words))) for _ in range(count)]
