"""The corpus's ``tasks`` family: everyday programming requests.

The ``code`` and ``polyglot`` families are built from the Python standard
library's own functions, so they ask for ``cgitb.reset`` or ``mailbox.Mailbox``.
People mostly ask for small, ordinary programs: a helper function, a query,
a shell one-liner, how to do a common thing in their language. These prompts
are generated from lists of such tasks and languages, each keeping its task as
its source, so a held-out task is held out in every language.
"""

from __future__ import annotations

import random
from typing import List

from .prompt import Prompt, dedupe, user_prompt

LANGUAGES = [
    "Python",
    "JavaScript",
    "TypeScript",
    "Go",
    "Rust",
    "Java",
    "C#",
    "Ruby",
    "PHP",
    "Kotlin",
    "C++",
    "Swift",
]
# What a small function does (it follows "a function that").
FUNCTIONS = [
    "checks whether a string is a valid IPv4 address",
    "converts a temperature between Celsius and Fahrenheit",
    "splits a full name into a first and a last name",
    "returns the median of a list of numbers",
    "flattens a nested list",
    "groups a list of people by age bracket",
    "merges two sorted lists into one sorted list",
    "computes the number of days between two dates",
    "formats a number of bytes as a human-readable size (KB, MB, GB)",
    "checks a password for a minimum length, a digit and a symbol",
    "converts a snake_case string to camelCase",
    "removes duplicate items from a list while keeping their order",
    "finds the longest common prefix of a list of strings",
    "parses a URL query string into a map of parameters",
    "formats a price with two decimals and a currency symbol",
    "checks whether two strings are anagrams",
    "splits a list into chunks of a given size",
    "retries a failing operation up to three times with a delay",
    "reads a CSV file and returns its rows as records",
    "keeps a moving average of the last ten sensor readings",
    "converts a Roman numeral to an integer",
    "generates a random password of a given length",
    "checks whether a year is a leap year",
    "shortens a long string and appends an ellipsis",
    "reverses the order of the words in a sentence",
    "finds the second largest number in a list",
    "masks all but the last four digits of a card number",
    "turns a list of key-value pairs into a dictionary",
    "validates an email address with a simple pattern",
    "applies a percentage discount code to a basket total",
    "turns a number of seconds into hours, minutes and seconds",
    "deep-merges two nested configuration objects",
    "computes the edit distance between two strings",
    "returns one page of a list, given a page number and a page size",
    "checks whether the brackets in a string are balanced",
    "converts a hex color code to RGB values",
    "calculates compound interest over a number of years",
    "capitalizes the first letter of every word in a title",
    "finds the most common element of a list",
    "rotates a matrix by 90 degrees",
    "checks whether a number is prime",
    "converts a date from DD/MM/YYYY to ISO 8601",
    "builds a slug for a blog post title",
    "sums the digits of an integer",
    "finds pairs of numbers in a list that add up to a target",
    "caches the results of an expensive function",
]
FUNCTION_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "How would I write a function in {lang} that {task}? Show the code and "
    "explain it briefly.",
    "Can you give me {lang} code for a function that {task}? Include an example call.",
    "I need a small {lang} helper that {task}. Keep it simple and readable.",
    "Write a {lang} function that {task}, and add a couple of tests for it.",
]
# Common things to do in a language (they follow "How do I").
HOW_TOS = [
    "read a file line by line",
    "make an HTTP GET request and read the JSON it returns",
    "sort a map by its values",
    "handle errors properly",
    "work with dates and time zones",
    "run several tasks at the same time",
    "read an environment variable with a default value",
    "parse command-line arguments",
    "write a unit test",
    "put variables into a string",
    "read and write a JSON file",
    "iterate over a list with its indexes",
    "define and use an enum",
    "write log messages to a file",
    "query a SQLite database",
    "time how long a piece of code takes",
    "define a class with a constructor and a method",
    "copy a file to another folder",
    "split a string on a delimiter",
    "generate a random number in a range",
]
HOW_TO_TEMPLATES = [
    "How do I {how} in {lang}?",
    "What's the idiomatic way to {how} in {lang}? Give a short example.",
    "Show me how to {how} in {lang}, with a brief explanation.",
]
# Two tables and questions about them (each follows "a SQL query that").
SQL_SCHEMAS = {
    "employees(id, name, department_id, salary, hired_on) and departments(id, name)": [
        "returns the average salary of each department",
        "lists the employees hired in the last 90 days with their department",
        "finds the departments with no employees",
        "finds the highest-paid employee in every department",
    ],
    "books(id, title, author, published_year) and loans(id, book_id, member_id, "
    "loaned_on, returned_on)": [
        "lists the books that are on loan right now",
        "counts the loans of each author's books",
        "finds the books that have never been borrowed",
        "finds the members with more than three loans not yet returned",
    ],
    "students(id, name, class) and grades(student_id, subject, score)": [
        "returns each student's average score",
        "finds the best student of each class in mathematics",
        "lists the students who failed any subject (score under 40)",
        "counts the students per class whose average is above 70",
    ],
    "sensors(id, location) and readings(sensor_id, taken_at, value)": [
        "returns the latest reading of every sensor",
        "computes the daily average value per location",
        "finds the sensors that sent nothing in the last hour",
        "finds the readings more than twice their sensor's average",
    ],
    "songs(id, title, artist) and plays(song_id, user_id, played_at)": [
        "lists the ten most played songs of this month",
        "counts the distinct listeners of each artist",
        "finds the songs nobody has played",
        "returns each user's favourite artist by number of plays",
    ],
    "tickets(id, agent_id, opened_at, closed_at, priority) and agents(id, name, "
    "team)": [
        "returns the average time to close a ticket per team",
        "lists the open high-priority tickets with their agent",
        "counts the tickets each agent closed last week",
        "finds the agents with no open tickets",
    ],
}
SQL_TEMPLATES = [
    "Given the tables {schema}, write a SQL query that {question}.",
    "I have two tables, {schema}. How do I write a SQL query that {question}? "
    "Explain the query.",
]
REGEXES = [
    "dates written as 2024-05-31",
    "UK postcodes",
    "hex color codes such as #1a2b3c",
    "times in 24-hour format",
    "semantic version numbers such as 1.4.2",
    "file names ending in .jpg or .png",
    "words written in capital letters",
    "amounts of money such as $1,250.00",
    "hashtags in a tweet",
    "lines that start with a comment sign",
]
REGEX_TEMPLATES = [
    "Write a regular expression that matches {thing}, and explain each part.",
    "What regex would match {thing}? Show a few strings it accepts and rejects.",
]
SHELL_TASKS = [
    "counts the lines of every .py file in a folder",
    "lists the ten largest files under the current directory",
    "replaces a word in all .txt files of a folder",
    "deletes log files older than seven days",
    "shows the processes using the most memory",
    "prints the second column of a CSV file",
    "renames every .jpeg file to .jpg",
    "checks whether a port is already in use",
    "backs up a folder into a dated tar.gz archive",
    "prints how much disk space each subfolder takes",
]
SHELL_TEMPLATES = [
    "Write a Bash command that {task}.",
    "Give me a shell script that {task}, and explain how it works.",
]
CONCEPTS = [
    ("a list", "a tuple in Python"),
    ("let", "const in JavaScript"),
    ("an interface", "an abstract class"),
    ("a process", "a thread"),
    ("the stack", "the heap"),
    ("INNER JOIN", "LEFT JOIN in SQL"),
    ("git merge", "git rebase"),
    ("an HTTP GET request", "a POST request"),
    ("synchronous", "asynchronous code"),
    ("a shallow copy", "a deep copy"),
    ("unit tests", "integration tests"),
    ("a compiled", "an interpreted language"),
]
CONCEPT_TEMPLATES = [
    "What's the difference between {a} and {b}? Give a short example.",
    "Explain {a} versus {b} to a junior developer.",
]


def task_prompts() -> List[Prompt]:
    """Every ``tasks`` prompt, in a fixed order (seeded choices of templates)."""
    rng = random.Random("corpus:tasks")
    out = []

    def add(template: str, source: str, **words):
        out.append(user_prompt("tasks", template.format(**words), source))

    for task in FUNCTIONS:
        for lang in LANGUAGES:
            add(rng.choice(FUNCTION_TEMPLATES), f"task:{task}", lang=lang, task=task)
    for how in HOW_TOS:
        for lang in LANGUAGES:
            add(rng.choice(HOW_TO_TEMPLATES), f"how:{how}", lang=lang, how=how)
    for schema, questions in SQL_SCHEMAS.items():
        for question in questions:
            for template in SQL_TEMPLATES:
                add(template, f"sql:{question}", schema=schema, question=question)
    for thing in REGEXES:
        for template in REGEX_TEMPLATES:
            add(template, f"regex:{thing}", thing=thing)
    for task in SHELL_TASKS:
        for template in SHELL_TEMPLATES:
            add(template, f"shell:{task}", task=task)
    for a, b in CONCEPTS:
        for template in CONCEPT_TEMPLATES:
            add(template, f"concept:{a}/{b}", a=a, b=b)
    return dedupe(out)
