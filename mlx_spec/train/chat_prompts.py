"""The built-in chat prompts: templates filled with topic lists."""

from __future__ import annotations

import itertools
import random
from typing import List

from .prompt import Prompt, dedupe, split_of, user_prompt

TOPICS = {
    "science": [
        "photosynthesis",
        "black holes",
        "plate tectonics",
        "the water cycle",
        "DNA replication",
        "vaccines",
        "climate change",
        "the immune system",
        "gravity",
        "electricity",
        "magnetism",
        "the periodic table",
        "evolution by natural selection",
        "the speed of light",
        "volcanoes",
        "earthquakes",
        "the solar system",
        "the moon's phases",
        "ocean tides",
        "antibiotics",
        "the human heart",
        "sleep cycles",
        "nuclear fusion",
        "renewable energy",
        "the greenhouse effect",
        "rainbows",
        "sound waves",
        "bacteria and viruses",
        "the nervous system",
        "coral reefs",
        "quantum entanglement",
        "the big bang",
        "enzymes",
        "erosion",
        "weather fronts",
        "the carbon cycle",
        "stem cells",
        "radioactivity",
    ],
    "technology": [
        "the internet",
        "cloud computing",
        "machine learning",
        "blockchain",
        "password managers",
        "two-factor authentication",
        "solid state drives",
        "electric cars",
        "3D printing",
        "GPS",
        "Wi-Fi",
        "smartphone batteries",
        "open source software",
        "virtual reality",
        "compilers",
        "databases",
        "version control",
        "web browsers",
        "encryption",
        "search engines",
        "operating systems",
        "computer memory",
        "email spam filters",
        "recommendation systems",
        "self-driving cars",
        "QR codes",
        "data compression",
        "computer viruses",
        "domain names",
        "APIs",
    ],
    "daily life": [
        "saving money",
        "meal planning",
        "time management",
        "public speaking",
        "learning a new language",
        "keeping houseplants alive",
        "decluttering",
        "making friends in a new city",
        "staying motivated",
        "budgeting",
        "moving to a new apartment",
        "preparing for a job interview",
        "writing a resume",
        "negotiating a salary",
        "morning routines",
        "reducing screen time",
        "working from home",
        "organizing a closet",
        "hosting a dinner party",
        "taking better notes",
        "commuting by bike",
        "caring for a puppy",
        "planning a birthday party",
        "reading more books",
        "starting a vegetable garden",
        "cleaning a kitchen",
        "packing for a trip",
    ],
    "health": [
        "drinking enough water",
        "stretching",
        "running for beginners",
        "healthy breakfasts",
        "reducing stress",
        "posture at a desk",
        "getting better sleep",
        "strength training",
        "eating more vegetables",
        "meditation",
        "walking every day",
        "sunscreen",
        "healthy snacks",
        "back pain prevention",
        "eye strain",
        "cutting down on sugar",
    ],
    "history": [
        "the Roman Empire",
        "the printing press",
        "the Industrial Revolution",
        "the Renaissance",
        "ancient Egypt",
        "the Silk Road",
        "the Cold War",
        "the invention of the telephone",
        "the first moon landing",
        "the French Revolution",
        "the Great Wall of China",
        "the Vikings",
        "the history of the bicycle",
        "the history of chess",
        "the invention of paper",
        "ancient Greek philosophy",
        "the Maya",
        "the history of coffee",
        "the steam engine",
        "the history of maps",
    ],
    "food": [
        "bread baking",
        "fermentation",
        "making pasta from scratch",
        "spices",
        "coffee brewing",
        "tea",
        "sourdough starters",
        "grilling vegetables",
        "knife skills",
        "soups",
        "rice",
        "lentils",
        "chocolate",
        "olive oil",
        "cheese making",
        "pickling",
        "salads",
        "pancakes",
        "curry",
        "tofu",
    ],
    "nature": [
        "honey bees",
        "migratory birds",
        "rainforests",
        "deserts",
        "octopuses",
        "whales",
        "mushrooms",
        "wolves",
        "tides pools",
        "glaciers",
        "owls",
        "ants",
        "penguins",
        "redwood trees",
        "butterflies",
        "river deltas",
    ],
    "arts": [
        "impressionist painting",
        "jazz",
        "writing poetry",
        "photography",
        "learning the guitar",
        "classical music",
        "street art",
        "pottery",
        "film editing",
        "theater",
        "calligraphy",
        "origami",
        "knitting",
        "comic books",
        "architecture",
        "graphic design",
        "dance",
    ],
    "economics": [
        "inflation",
        "interest rates",
        "supply and demand",
        "the stock market",
        "index funds",
        "compound interest",
        "taxes",
        "credit scores",
        "small businesses",
        "trade",
        "unemployment",
        "insurance",
        "startups",
    ],
    "learning": [
        "studying for exams",
        "learning to code",
        "memorization techniques",
        "learning mathematics",
        "reading comprehension",
        "critical thinking",
        "writing essays",
        "learning to draw",
        "teaching children to read",
        "online courses",
        "spaced repetition",
        "learning to type faster",
    ],
}


AUDIENCES = [
    "a ten-year-old",
    "a complete beginner",
    "a high school student",
    "a busy professional",
    "my grandmother",
    "a university student",
]


FORMATS = [
    "in three bullet points",
    "in one short paragraph",
    "in under 80 words",
    "as a numbered list",
    "in two sentences",
    "with a simple example",
]


FORMS = [
    "a short poem",
    "a haiku",
    "a limerick",
    "a short story of five sentences",
    "a motivational quote",
    "a tweet",
    "a riddle",
    "a dialogue between two friends",
    "a product description",
    "a diary entry",
    "a short speech",
    "a fun fact list",
]


PEOPLE = ["manager", "landlord", "teacher", "neighbor", "coworker", "friend", "doctor"]


SITUATIONS = [
    "a late payment",
    "a schedule change",
    "a broken heater",
    "a missed deadline",
    "a noisy party",
    "a thank-you for their help",
    "a request for time off",
    "a meeting next week",
    "a lost package",
    "a shared project",
]


PLACES = [
    "Lisbon",
    "Kyoto",
    "a small mountain village",
    "Mexico City",
    "the Scottish Highlands",
    "Vancouver",
    "Cape Town",
    "a national park",
    "Istanbul",
    "a seaside town",
    "Prague",
    "Buenos Aires",
    "Reykjavik",
    "Marrakech",
    "Seoul",
    "New Orleans",
]


INGREDIENTS = [
    "chickpeas",
    "spinach",
    "eggs",
    "potatoes",
    "rice",
    "mushrooms",
    "tomatoes",
    "zucchini",
    "lentils",
    "oats",
    "apples",
    "salmon",
    "tofu",
    "carrots",
    "beans",
]


# Templates over one topic; "{audience}", "{fmt}" and "{form}" are filled too.
TOPIC_TEMPLATES = [
    "Explain {topic} to {audience}.",
    "What is the most important thing to know about {topic}?",
    "Give me three interesting facts about {topic}.",
    "Explain {topic} {fmt}.",
    "What are common misconceptions about {topic}?",
    "Write {form} about {topic}.",
    "Why does {topic} matter? Answer {fmt}.",
    "I'm curious about {topic}. Where should I start?",
    "Summarize what you know about {topic} {fmt}.",
    "What questions would a beginner ask about {topic}? List five.",
    "Describe {topic} using an analogy.",
    "What are the pros and cons of {topic}?",
    "Tell me a short story that teaches something about {topic}.",
    "Create a short quiz with three questions about {topic}, with answers.",
    "How would you explain {topic} in a job interview?",
    "Give a step-by-step introduction to {topic}.",
    "What is a good book or resource type for learning about {topic}, and why?",
    "Write a friendly paragraph introducing {topic} to {audience}.",
    "What are the key terms someone should learn about {topic}? Define each briefly.",
    "Can you give me tips related to {topic}?",
]


# Templates over two topics of the same category.
PAIR_TEMPLATES = [
    "What is the difference between {a} and {b}?",
    "Compare {a} and {b} {fmt}.",
    "How are {a} and {b} related?",
    "Which is easier to learn about first, {a} or {b}? Explain.",
]


# Everyday requests with their own slots.
REQUEST_TEMPLATES = [
    ("Plan a {n}-day trip to {place}.", "place"),
    ("What should I pack for a week in {place}?", "place"),
    ("Suggest a simple recipe using {x} and {y}.", "ingredient"),
    ("What can I cook for dinner with {x}, {y} and some pasta?", "ingredient"),
    ("Write a polite email to my {person} about {situation}.", "person"),
    ("Help me write a short text message to a {person} about {situation}.", "person"),
    ("Give me a {n}-week plan to get better at {topic}.", "topic"),
    ("I have {n} minutes a day. How can I use them to learn about {topic}?", "topic"),
]


def chat_prompts() -> List[Prompt]:
    """Every chat prompt, in a fixed order."""
    rng = random.Random(1234)
    out = []
    for category, topics in sorted(TOPICS.items()):
        for topic in topics:
            source = f"chat:{topic}"
            for i, template in enumerate(TOPIC_TEMPLATES):
                text = template.format(
                    topic=topic,
                    audience=AUDIENCES[(i + len(topic)) % len(AUDIENCES)],
                    fmt=FORMATS[(i * 7 + len(topic)) % len(FORMATS)],
                    form=FORMS[(i * 5 + len(topic)) % len(FORMS)],
                )
                out.append(user_prompt("chat", first_upper(text), source))
        for a, b in itertools.combinations(topics, 2):
            if rng.random() > 0.12:  # a sample of the pairs keeps the pool balanced
                continue
            template = rng.choice(PAIR_TEMPLATES)
            text = template.format(a=a, b=b, fmt=rng.choice(FORMATS))
            # A pair belongs to the split of its first topic (and is dropped
            # if its second topic is in the other split).
            if split_of(f"chat:{a}") == split_of(f"chat:{b}"):
                out.append(user_prompt("chat", first_upper(text), f"chat:{a}"))
    all_topics = [t for ts in TOPICS.values() for t in ts]
    for template, kind in REQUEST_TEMPLATES:
        for j in range(60):
            n = 2 + j % 6
            if kind == "place":
                item = PLACES[j % len(PLACES)]
                text = template.format(n=n, place=item)
            elif kind == "ingredient":
                x, y = rng.sample(INGREDIENTS, 2)
                item, text = x, template.format(x=x, y=y)
            elif kind == "person":
                item = PEOPLE[j % len(PEOPLE)]
                text = template.format(person=item, situation=rng.choice(SITUATIONS))
            else:
                item = rng.choice(all_topics)
                text = template.format(n=n, topic=item)
            out.append(user_prompt("chat", text, f"chat:{item}"))
    return dedupe(out)


def first_upper(text: str) -> str:
    return text[:1].upper() + text[1:]
