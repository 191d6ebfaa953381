"""The corpus's ``advice`` family: first-person, situational chat requests.

Real users rarely ask "explain X in three bullet points"; they describe their
own situation, with its numbers, places, times and constraints, and ask what
to try first, how to prepare, which of two options suits them, for a plan of
a few weeks, a checklist, or a short fact. Like every family, the prompts are
generated, never written one by one: each everyday domain lists problems (a
first-person clause), goals (an infinitive phrase), choices between two
options, short factual questions and details of the asker's life; request
shapes combine one situation with up to two details, and slots such as
``{weeks}`` or ``{city}`` are filled from shared lists (seeded). Every prompt
keeps its situation as its source (``advice:<domain>:<situation>``), so its
split follows :func:`~mlx_spec.train.prompt.split_of` and no held-out
situation trains.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from .prompt import Prompt, dedupe, user_prompt

# Prompts drawn for each problem, goal or choice, and for each short question
# (before dedupe).
PER_SITUATION = 24
PER_QUESTION = 4


@dataclass(frozen=True)
class Domain:
    """One everyday domain and its situations.

    Attributes:
        name: The domain, part of each prompt's source.
        problems: First-person clauses, lower case, no final stop
          ("my dog pulls hard on the lead on every walk").
        goals: Infinitive phrases without "to" ("start running again").
        choices: ``(option a, option b, purpose)``; the purpose follows "for".
        questions: Short factual questions, whole sentences.
        details: Sentences about the asker's life in this domain.
    """

    name: str
    problems: Sequence[str]
    goals: Sequence[str]
    choices: Sequence[Tuple[str, str, str]]
    questions: Sequence[str]
    details: Sequence[str]


# Values of the slots any list may use.
SLOTS = {
    "minutes": ["10", "15", "20", "30", "45"],
    "hours": ["two", "three", "four", "six"],
    "days": ["three", "four", "five", "ten"],
    "per_week": ["two", "three", "four"],
    "weeks": ["two", "four", "six", "eight", "twelve"],
    "months": ["two", "three", "six", "nine"],
    "people": ["two", "three", "four", "five", "six"],
    "guests": ["12", "20", "30", "45", "60"],
    "money": ["$40", "£50", "€60", "$100", "£150", "€200"],
    "big_money": ["$800", "£1,200", "€2,000", "$3,500", "£5,000"],
    "salary": ["$52,000", "£38,000", "€45,000", "$70,000"],
    "kid_age": ["two", "four", "six", "nine", "ten", "fourteen"],
    "pet_age": ["one-year-old", "three-year-old", "five-year-old", "twelve-year-old"],
    "city": [
        "Manchester",
        "Denver",
        "Lyon",
        "Melbourne",
        "Toronto",
        "Dublin",
        "Osaka",
        "Leipzig",
        "Austin",
        "Porto",
        "Auckland",
        "Bristol",
    ],
    "destination": [
        "Portugal",
        "northern Italy",
        "Japan",
        "Iceland",
        "Vietnam",
        "Croatia",
        "Peru",
        "the Scottish islands",
        "Morocco",
        "Norway",
    ],
    "month": ["February", "April", "July", "September", "November"],
    "when": [
        "every evening",
        "on weekday mornings",
        "after about 9 pm",
        "around lunchtime",
        "on Sunday nights",
        "mostly at weekends",
    ],
    "distance": ["5 km", "10 km", "a half marathon"],
    "floor": ["second", "third", "fifth", "ninth"],
    "sqm": ["35", "50", "70", "90"],
    "year": ["2012", "2015", "2017", "2019"],
    "gb": ["4", "8", "16"],
}

DOMAINS = [
    Domain(
        "home",
        problems=[
            "my bathroom mirror fogs up and the ceiling keeps growing black mould",
            "our flat is freezing in the mornings even with the heating on {hours} "
            "hours a day",
            "the kitchen smells musty no matter how often I clean it",
            "I can never keep the house tidy for more than {days} days",
            "my bedroom gets so hot in summer that I can't sleep before 2 am",
            "our energy bill went up by {money} a month and nothing changed",
            "dust builds up on every surface within a couple of days",
            "my upstairs neighbours are loud {when}",
            "condensation runs down the bedroom windows every morning",
        ],
        goals=[
            "declutter a {sqm} m² flat before I move",
            "set up a cleaning routine that two busy adults will stick to",
            "make a small rented studio feel bigger without drilling holes",
            "cut our heating bill this winter",
            "soundproof a home office in a shared house",
            "get the whole house ready for a new baby",
            "organise a garage that hasn't been sorted in years",
        ],
        choices=[
            ("a robot vacuum", "a good cordless stick vacuum", "a flat with two cats"),
            ("blackout curtains", "blinds", "a bedroom that faces east"),
            ("a dehumidifier", "just opening the windows more", "a damp basement flat"),
            (
                "renting a bigger place",
                "staying put and storing things",
                "a family that's running out of room",
            ),
            (
                "an oil-filled radiator",
                "a fan heater",
                "heating one room in the evenings",
            ),
        ],
        questions=[
            "How often should I wash bed sheets?",
            "What's the safest way to clean black mould off a window frame?",
            "Can I mix bleach and vinegar for cleaning?",
            "How long does a mattress usually last?",
            "What temperature should a bedroom be for good sleep?",
        ],
        details=[
            "I rent, so I can't make big changes.",
            "The flat is on the {floor} floor and has no lift.",
            "It's about {sqm} square metres.",
            "We're {people} people sharing one bathroom.",
            "The building is old and the windows are single-glazed.",
            "I work from home {per_week} days a week.",
        ],
    ),
    Domain(
        "cooking",
        problems=[
            "my bread comes out dense and flat even though I follow the recipe",
            "my rice is always either mushy or burnt at the bottom",
            "I overcook chicken breasts every time and they come out dry",
            "my homemade pizza base is soggy in the middle",
            "my stir-fries end up watery instead of crisp",
            "I end up throwing away half the vegetables I buy each week",
            "my cookies spread into one big flat sheet in the oven",
            "my pancakes are burnt outside and raw inside",
            "I get bored of my own cooking after a week",
        ],
        goals=[
            "cook dinner for {people} people on {money} a week",
            "batch-cook lunches for the whole work week on Sundays",
            "bake my first loaf of sourdough",
            "learn to cook without following a recipe word for word",
            "cook more vegetarian meals that my family will actually eat",
            "host a dinner for {people} friends with one oven",
            "get faster at chopping vegetables",
        ],
        choices=[
            ("a cast-iron pan", "a non-stick pan", "everyday cooking for one"),
            ("a rice cooker", "a pressure cooker", "quick weeknight meals"),
            (
                "meal kits",
                "planning and shopping myself",
                "a couple who both work late",
            ),
            ("a stand mixer", "mixing by hand", "baking bread twice a week"),
            (
                "an air fryer",
                "a small countertop oven",
                "a kitchen with no proper oven",
            ),
        ],
        questions=[
            "How long do cooked leftovers keep in the fridge?",
            "Can I freeze cooked rice?",
            "What can I use instead of eggs in pancakes?",
            "Why do recipes say to rest meat after cooking?",
            "How do I know when oil is hot enough for frying?",
        ],
        details=[
            "I only have {minutes} minutes to cook after work.",
            "My kitchen has two hot plates and a microwave.",
            "One of us is vegetarian and the other isn't.",
            "I cook for a family of {people}.",
            "My budget for food is about {money} a week.",
            "I'm a beginner and I don't own many tools.",
        ],
    ),
    Domain(
        "pets",
        problems=[
            "our new puppy bites our hands whenever we play",
            "my cat scratches the sofa even though she has a scratching post",
            "my dog barks at every person who walks past the window",
            "our rescue dog pulls so hard on the lead that walks are miserable",
            "my cat wakes me up at 5 am every day asking for food",
            "my dog gets frantic when I leave the house, even for {minutes} minutes",
            "my rabbit stopped eating pellets this week",
            "our two cats hiss and fight since we moved",
            "my {pet_age} dog still has accidents indoors",
        ],
        goals=[
            "adopt a dog while working full time",
            "teach my puppy to walk on a loose lead",
            "introduce a new kitten to my older cat",
            "get my dog used to being alone for a few hours",
            "travel by car for {hours} hours with a nervous cat",
            "keep an indoor cat busy and happy",
            "crate-train a ten-week-old puppy",
        ],
        choices=[
            ("a cat", "a dog", "someone who lives alone in a flat"),
            ("dry food", "wet food", "an older cat"),
            ("a dog walker", "doggy daycare", "a young dog left alone on work days"),
            (
                "pet insurance",
                "putting money aside each month",
                "a healthy young dog",
            ),
            ("a harness", "a collar", "a small dog that pulls"),
        ],
        questions=[
            "How often should I take my cat to the vet?",
            "Is chocolate really dangerous for dogs?",
            "How much exercise does a medium-sized dog need each day?",
            "Can cats drink milk?",
            "How often should I clip my dog's nails?",
        ],
        details=[
            "I live in a flat on the {floor} floor with no garden.",
            "I'm out of the house about {hours} hours on work days.",
            "We got the dog from a shelter {months} months ago.",
            "I have a {kid_age}-year-old at home too.",
            "My budget for the pet is around {money} a month.",
            "This is my first pet.",
        ],
    ),
    Domain(
        "travel",
        problems=[
            "I always overpack and end up paying for checked luggage",
            "I get badly jet-lagged for days after every long flight",
            "I get carsick on long bus rides",
            "my trips always run over budget by the last few days",
            "I spend most of my holidays planning instead of relaxing",
            "I never sleep well on overnight trains or flights",
            "my travel plans keep falling apart because of delays",
        ],
        goals=[
            "spend {days} days in {destination} in {month}",
            "plan a trip to {destination} with two kids under ten",
            "travel for a month with only a carry-on bag",
            "take a road trip with my dog",
            "plan a honeymoon for {big_money}",
            "visit {destination} on my own for the first time",
            "see as much of {destination} as possible without renting a car",
        ],
        choices=[
            (
                "the train",
                "a budget flight",
                "a {hours}-hour trip between two cities",
            ),
            ("a hotel", "a rented apartment", "a family of {people} staying a week"),
            (
                "a guided tour",
                "travelling independently",
                "a first trip to {destination}",
            ),
            ("travel insurance", "taking the risk", "a cheap {days}-day trip"),
            ("a backpack", "a wheeled suitcase", "a trip with lots of trains"),
        ],
        questions=[
            "How early should I get to the airport for an international flight?",
            "Do I need a visa to visit {destination} for two weeks?",
            "What is the best way to carry money abroad?",
            "Can I take a power bank in checked luggage?",
            "How do I avoid roaming charges on my phone?",
        ],
        details=[
            "We're flying out of {city}.",
            "Our budget is about {big_money} for everything.",
            "I don't speak the local language at all.",
            "One of us has bad knees, so long walks are hard.",
            "We can only go in {month}.",
            "I'm travelling with {people} friends.",
        ],
    ),
    Domain(
        "fitness",
        problems=[
            "I've been going to the gym for {months} months and I'm not getting "
            "any stronger",
            "my knees hurt after every run",
            "I start a new workout plan every January and quit by February",
            "my lower back aches after deadlifts",
            "I get out of breath climbing two flights of stairs",
            "I can't do a single push-up",
            "my running pace hasn't improved in {months} months",
            "I'm always too tired to train after work",
        ],
        goals=[
            "run {distance} without stopping",
            "get fit enough to hike for a full day",
            "build strength at home with only a pair of dumbbells",
            "do my first pull-up",
            "get back into exercise after a long break",
            "train for my first 10 km race in {month}",
            "become more flexible so I can touch my toes",
        ],
        choices=[
            (
                "a gym membership",
                "a home set of weights",
                "getting stronger on a budget",
            ),
            ("running", "cycling", "losing weight with sore knees"),
            (
                "a personal trainer",
                "a training app",
                "a beginner who needs structure",
            ),
            (
                "morning workouts",
                "evening workouts",
                "someone who works nine to five",
            ),
            ("yoga", "pilates", "a stiff back from desk work"),
        ],
        questions=[
            "How many rest days a week do beginners need?",
            "Should I stretch before or after running?",
            "How much protein do I need if I lift weights?",
            "Is it bad to work out when I'm sore?",
            "How long does it take to lose fitness after stopping?",
        ],
        details=[
            "I can train {per_week} days a week for about {minutes} minutes.",
            "I'm in my forties and haven't exercised in years.",
            "I have an old ankle injury.",
            "I can only train {when}.",
            "There's a park near me but no gym.",
            "I weigh a bit more than I'd like.",
        ],
    ),
    Domain(
        "health habits",
        problems=[
            "I wake up at 3 am most nights and can't fall back asleep",
            "I drink {people} coffees a day and still feel tired",
            "I snack all evening even when I'm not hungry",
            "my eyes are sore and dry after a day at the screen",
            "I check my phone in bed for an hour every night",
            "I get a headache most afternoons at work",
            "I forget to drink water until the evening",
            "I feel stiff and achy after sitting all day",
        ],
        goals=[
            "go to bed before 11 pm on work nights",
            "cut down to one coffee a day",
            "eat more vegetables without cooking much",
            "build a short morning routine I can keep",
            "spend less time on my phone in the evenings",
            "walk 8,000 steps a day with a desk job",
            "drink less alcohol at weekends",
        ],
        choices=[
            ("a standing desk", "a better chair", "back pain from desk work"),
            (
                "a sleep tracker",
                "a simple sleep diary",
                "working out why I sleep badly",
            ),
            ("meditation apps", "journaling", "winding down before bed"),
            (
                "intermittent fasting",
                "smaller regular meals",
                "stopping evening snacking",
            ),
        ],
        questions=[
            "How much sleep does an adult really need?",
            "Is it bad to drink coffee after 3 pm?",
            "How long does it take to form a habit?",
            "Does screen brightness affect sleep?",
            "How much water should I drink a day?",
        ],
        details=[
            "I work shifts, so my hours change every week.",
            "I have a {minutes}-minute commute each way.",
            "I live with a partner who goes to bed much later than me.",
            "I sit at a desk for about {hours} hours straight.",
            "I've tried apps before and stopped using them.",
        ],
    ),
    Domain(
        "money",
        problems=[
            "I run out of money a week before every payday",
            "I have {big_money} on a credit card and only pay the minimum",
            "I keep signing up for subscriptions and forgetting them",
            "my partner and I argue about spending every month",
            "I earn {salary} a year and somehow save nothing",
            "I spend about {money} a week on takeaways without noticing",
            "my savings are sitting in an account that pays almost no interest",
        ],
        goals=[
            "save {big_money} for an emergency fund",
            "pay off {big_money} of credit card debt",
            "make a budget I can actually follow on {salary} a year",
            "save for a house deposit over the next few years",
            "start investing with {money} a month",
            "plan a wedding without going into debt",
            "split bills fairly with a partner who earns more",
        ],
        choices=[
            (
                "paying off debt first",
                "building savings first",
                "someone with {big_money} of card debt",
            ),
            (
                "an index fund",
                "a savings account",
                "money I won't touch for five years",
            ),
            ("renting", "buying", "someone who may move cities in two years"),
            ("a cheap used car", "a car on finance", "a {minutes}-minute commute"),
            ("a joint account", "separate accounts", "a couple moving in together"),
        ],
        questions=[
            "What is an emergency fund and how big should it be?",
            "How does compound interest work, in one paragraph?",
            "What's the difference between a debit card and a credit card?",
            "Does checking my credit score lower it?",
            "What is the 50/30/20 budgeting rule?",
        ],
        details=[
            "I take home about {big_money} a month.",
            "Rent takes about half of my income.",
            "I'm paid every two weeks.",
            "I have a student loan as well.",
            "I live in {city}, where everything is expensive.",
            "We have {people} people in the household.",
        ],
    ),
    Domain(
        "work and career",
        problems=[
            "my manager keeps adding work without taking anything off my plate",
            "I freeze up and ramble whenever I speak in meetings",
            "I've applied to {guests} jobs and haven't had a single interview",
            "I'm bored in my job but scared to leave",
            "a colleague keeps taking credit for my work",
            "I can't switch off from work in the evenings",
            "I procrastinate on big tasks until the night before",
            "I haven't had a raise in almost three years",
        ],
        goals=[
            "ask for a raise after {months} months in the role",
            "move from teaching into a tech job",
            "prepare for my first job interview in years",
            "get promoted to team lead within a year",
            "start freelancing on the side",
            "prepare for a performance review next month",
            "negotiate a four-day week",
        ],
        choices=[
            (
                "a job with higher pay",
                "a job with a shorter commute",
                "a parent of a {kid_age}-year-old",
            ),
            (
                "a master's degree",
                "online certificates",
                "switching into data analysis",
            ),
            ("a big company", "a startup", "a first job after university"),
            (
                "staying in my current role",
                "taking an offer at {salary}",
                "my long-term career",
            ),
            (
                "working from home",
                "going into the office",
                "someone new to the team",
            ),
        ],
        questions=[
            "How long should a cover letter be?",
            "Should a CV include a photo?",
            "How soon after an interview is it fine to follow up?",
            "What does a notice period mean?",
            "How many pages should a resume be?",
        ],
        details=[
            "I've been at the company for {months} years.",
            "I earn about {salary} now.",
            "I work in a team of {people} people.",
            "My commute is {minutes} minutes each way.",
            "I'm quite introverted.",
            "My contract ends in {month}.",
        ],
    ),
    Domain(
        "study",
        problems=[
            "I read my notes again and again but forget everything in the exam",
            "I can't concentrate for more than {minutes} minutes when I study",
            "I always leave essays until the night before the deadline",
            "I understand the maths in class but can't do the homework alone",
            "I fall asleep whenever I try to read my textbook",
            "I've been learning Spanish for {months} months and still can't hold a "
            "conversation",
            "I get so nervous in exams that my mind goes blank",
        ],
        goals=[
            "pass my driving theory test",
            "revise for {people} exams at the same time",
            "learn enough Japanese for a trip in {month}",
            "get through a programming course while working full time",
            "write a {guests}-page dissertation without panicking",
            "learn to touch-type",
            "read one book a month again",
        ],
        choices=[
            ("flashcards", "practice questions", "revising for a biology exam"),
            (
                "studying in a library",
                "studying at home",
                "someone easily distracted",
            ),
            ("an app", "a weekly class", "learning a language as an adult"),
            ("handwritten notes", "typed notes", "lectures that move fast"),
        ],
        questions=[
            "What is spaced repetition?",
            "How long should a study break be?",
            "Is it better to study in the morning or at night?",
            "What's the Pomodoro technique?",
            "Does listening to music help you study?",
        ],
        details=[
            "My exams start in {weeks} weeks.",
            "I also work {per_week} evenings a week.",
            "I share a room, so it's noisy at home.",
            "I can study about {hours} hours a day.",
            "English isn't my first language.",
        ],
    ),
    Domain(
        "relationships",
        problems=[
            "my best friend cancels our plans at the last minute every time",
            "my partner and I argue about chores every week",
            "I moved to {city} {months} months ago and still haven't made friends",
            "my sister always asks to borrow money and never pays it back",
            "my flatmate never cleans up after cooking",
            "I find it hard to say no when people ask for favours",
            "my parents criticise every decision I make",
        ],
        goals=[
            "make friends in a new city as an adult",
            "talk to my partner about moving in together",
            "set boundaries with a friend who only calls when she needs something",
            "plan a surprise for our tenth anniversary",
            "reconnect with a friend I haven't spoken to in years",
            "bring up money with my partner without a fight",
        ],
        choices=[
            (
                "telling my friend the truth",
                "letting it go",
                "a friend who said something hurtful",
            ),
            ("a dating app", "joining clubs", "meeting someone in my thirties"),
            (
                "moving in together",
                "waiting another year",
                "a couple together for {months} months",
            ),
            ("a big party", "a quiet dinner", "my partner's fortieth birthday"),
        ],
        questions=[
            "How do I start a conversation with someone I've just met?",
            "What's a good way to apologise sincerely?",
            "How often do close friends usually see each other?",
            "Is it normal for couples to argue every week?",
        ],
        details=[
            "We've known each other since school.",
            "We live together in a small flat.",
            "I'm quite shy with new people.",
            "We've been together {months} years.",
            "I work evenings, so my free time is odd.",
        ],
    ),
    Domain(
        "parenting",
        problems=[
            "my {kid_age}-year-old refuses to go to bed before 10 pm",
            "our toddler throws a tantrum every time we leave the playground",
            "my son only eats pasta and plain bread",
            "my {kid_age}-year-old spends {hours} hours a day on a tablet",
            "my daughter says she has no friends at her new school",
            "our kids fight constantly on long car journeys",
            "my teenager won't talk to me about anything",
            "mornings are chaos and we're late for school every week",
        ],
        goals=[
            "get a {kid_age}-year-old to help with chores",
            "potty-train a toddler before nursery starts in {month}",
            "teach my {kid_age}-year-old to ride a bike",
            "plan a birthday party for {guests} children",
            "cut down screen time for the whole family",
            "prepare my child for starting school",
            "give my kids pocket money that teaches them something",
        ],
        choices=[
            (
                "a nanny",
                "a nursery",
                "a {kid_age}-year-old with two working parents",
            ),
            ("a tablet", "a basic phone", "a {kid_age}-year-old's first device"),
            ("piano lessons", "a sports club", "a shy {kid_age}-year-old"),
            (
                "a family holiday abroad",
                "a week at home",
                "a family with {people} kids",
            ),
        ],
        questions=[
            "How much sleep does a {kid_age}-year-old need?",
            "At what age can kids start doing chores?",
            "How much screen time is recommended for young children?",
            "When do children usually learn to read?",
        ],
        details=[
            "I'm a single parent and work full time.",
            "We have {people} kids between two and ten.",
            "We live in a small flat in {city}.",
            "Both of us work until 6 pm.",
            "Grandparents help out {per_week} days a week.",
        ],
    ),
    Domain(
        "gardening",
        problems=[
            "my tomato plants have yellow leaves at the bottom",
            "the lawn has big bare patches after summer",
            "slugs eat everything I plant",
            "my basil keeps wilting on the kitchen windowsill",
            "my houseplant's leaves have brown, crispy tips",
            "my courgette plants flower but never make any fruit",
            "the soil in my garden is heavy clay and drains badly",
        ],
        goals=[
            "grow vegetables on a small north-facing balcony",
            "start a compost heap in a small back garden",
            "plant a garden that bees and butterflies will visit",
            "grow potatoes in containers",
            "turn part of a lawn into raised beds",
            "keep houseplants alive while I'm away for a month",
        ],
        choices=[
            (
                "raised beds",
                "planting straight into the ground",
                "a beginner with clay soil",
            ),
            ("seeds", "young plants from a nursery", "a first vegetable patch"),
            ("artificial grass", "a real lawn", "a small yard with a dog"),
            ("terracotta pots", "plastic pots", "plants on a sunny balcony"),
        ],
        questions=[
            "When should I plant tomatoes outside?",
            "How often should I water houseplants in winter?",
            "Can I use coffee grounds in the garden?",
            "What does 'full sun' mean on a seed packet?",
        ],
        details=[
            "I live in {city}, where it rains a lot.",
            "The garden gets about {hours} hours of sun a day.",
            "I can spend about {money} on it.",
            "I've never grown anything before.",
            "I only have time at weekends.",
        ],
    ),
    Domain(
        "repairs",
        problems=[
            "the bathroom sink drains so slowly it fills up while I brush my teeth",
            "the toilet keeps running for a minute after every flush",
            "there's a crack spreading across the ceiling in the hallway",
            "the front door sticks and won't close in wet weather",
            "the kitchen tap drips all night",
            "the silicone around the bath has gone black",
            "the radiator in the bedroom stays cold at the top",
            "a wall socket sparks when I plug things in",
        ],
        goals=[
            "paint a room for the first time",
            "hang heavy shelves on a plasterboard wall",
            "put together a basic toolkit for a first home",
            "retile a small bathroom floor",
            "fix a wobbly table",
            "put up a curtain rail in a rented flat",
        ],
        choices=[
            (
                "fixing it myself",
                "calling a plumber",
                "a leaking pipe under the sink",
            ),
            (
                "a cordless drill",
                "a corded drill",
                "occasional jobs around the house",
            ),
            ("water-based paint", "oil-based paint", "kitchen cupboards"),
            (
                "repairing the old washing machine",
                "buying a new one",
                "a machine from {year}",
            ),
        ],
        questions=[
            "How do I turn off the water supply to my house?",
            "What size screws do I need for hanging a mirror?",
            "How long does paint need to dry between coats?",
            "What's the difference between a fuse and a circuit breaker?",
        ],
        details=[
            "I've never used a drill.",
            "The house was built in the 1960s.",
            "I rent, and the landlord is slow to reply.",
            "I have a budget of about {money} for this.",
            "I have a basic set of screwdrivers and that's it.",
        ],
    ),
    Domain(
        "tech troubleshooting",
        problems=[
            "my phone battery drops from full to 20% by lunchtime",
            "the Wi-Fi drops out in the back bedroom every evening",
            "my printer says it's offline even though it's connected",
            "my {year} laptop takes five minutes to start up",
            "my phone storage is full but I can't tell what's filling it",
            "video calls freeze whenever someone else in the house is streaming",
            "my Bluetooth headphones keep disconnecting from my laptop",
            "my old PC with {gb} GB of RAM slows to a crawl with a few browser tabs",
            "I keep getting emails saying someone tried to log into my account",
        ],
        goals=[
            "back up every family photo so we never lose them",
            "set up a password manager for my whole family",
            "make an old laptop usable again",
            "move everything from my old phone to a new one",
            "set up parental controls for a {kid_age}-year-old",
            "get decent Wi-Fi in every room of a three-storey house",
            "clean up my email inbox of {guests},000 messages",
        ],
        choices=[
            (
                "a mesh Wi-Fi system",
                "a single better router",
                "a long, narrow house",
            ),
            (
                "a new laptop",
                "upgrading the RAM in my old one",
                "a laptop from {year}",
            ),
            (
                "cloud backup",
                "an external hard drive",
                "{hours} hundred gigabytes of photos",
            ),
            ("an Android phone", "an iPhone", "a parent who isn't good with tech"),
            ("a tablet", "a cheap laptop", "a student who mostly writes essays"),
        ],
        questions=[
            "What does restarting the router actually do?",
            "How often should I update my phone?",
            "What is two-factor authentication?",
            "Is it safe to use public Wi-Fi for banking?",
            "What's the difference between RAM and storage?",
        ],
        details=[
            "Most of our devices are a few years old.",
            "I'm not very technical, so keep it simple.",
            "We have about {people} devices on the Wi-Fi at once.",
            "It started after the last update.",
            "The router is in the hallway downstairs.",
            "I've already tried turning it off and on again.",
        ],
    ),
    Domain(
        "hobbies",
        problems=[
            "my sketches always look flat and stiff",
            "I've been learning guitar for {months} months and my chord changes are "
            "still slow",
            "my photos come out blurry indoors",
            "I start lots of knitting projects and never finish any",
            "my houseplant cuttings rot before they grow roots",
            "I lose interest in every hobby after a few weeks",
            "my watercolours turn muddy and grey",
        ],
        goals=[
            "learn to play piano as an adult with {minutes} minutes a day",
            "start bird-watching in the city",
            "get into running a tabletop game night for {people} friends",
            "take better photos with just my phone",
            "write a short story every month",
            "learn to sew simple clothes",
            "start a small podcast with a friend",
        ],
        choices=[
            ("an acoustic guitar", "an electric guitar", "an adult beginner"),
            ("a cheap beginner camera", "a good phone", "travel photos"),
            ("lessons", "videos online", "learning to draw"),
            ("a digital piano", "a second-hand upright piano", "a small flat"),
        ],
        questions=[
            "How long does it take to learn basic guitar chords?",
            "What is the rule of thirds in photography?",
            "Which knitting needles are best for beginners?",
            "How many hours a week do hobbies need to improve?",
        ],
        details=[
            "I can practise {minutes} minutes most days.",
            "My budget for gear is about {money}.",
            "I've never done anything artistic before.",
            "My flat has thin walls, so I need to keep noise down.",
            "I'd like to do it with my {kid_age}-year-old.",
        ],
    ),
    Domain(
        "shopping",
        problems=[
            "I buy clothes on sale that I never end up wearing",
            "I keep buying cheap shoes that fall apart in {months} months",
            "I always spend more than I planned in the supermarket",
            "the sofa I ordered arrived damaged and the shop won't answer",
            "I end up with drawers full of gadgets I don't use",
            "I can never find jeans that fit",
        ],
        goals=[
            "buy a mattress without getting ripped off",
            "build a small wardrobe that works for every season",
            "furnish a first flat on {big_money}",
            "buy a second-hand car for under {big_money}",
            "do our weekly food shop in one trip with a list",
            "buy fewer things this year",
        ],
        choices=[
            (
                "a new phone",
                "a refurbished one",
                "someone who keeps phones for years",
            ),
            ("buying in bulk", "buying weekly", "a household of {people}"),
            ("an extended warranty", "no warranty", "a {money} kitchen appliance"),
            (
                "an expensive winter coat",
                "a cheap one each year",
                "winters in {city}",
            ),
        ],
        questions=[
            "How do I return something I bought online?",
            "Are extended warranties worth it?",
            "What does 'refurbished' mean for electronics?",
            "When are the best times of year to buy a laptop?",
        ],
        details=[
            "I'd like to keep costs down.",
            "I live in {city}.",
            "I'd rather buy once and keep it for years.",
            "I don't have a car, so delivery matters.",
            "I shop mostly online.",
        ],
    ),
    Domain(
        "events",
        problems=[
            "half the guests haven't replied to our party invitations",
            "I've booked a venue for {guests} people and only half are coming",
            "my wedding speech is twelve minutes long and needs to be five",
            "everyone in our group chat wants a different date for the reunion",
            "the caterer for our event cancelled {days} days before",
            "I always forget someone when I plan a get-together",
        ],
        goals=[
            "plan a birthday party for {guests} guests on {money}",
            "organise a leaving do for a colleague",
            "host Christmas dinner for {people} people for the first time",
            "throw a surprise party without my partner finding out",
            "plan a small wedding for {guests} guests",
            "run a bake sale for my kid's school",
            "give a toast at my brother's wedding",
        ],
        choices=[
            (
                "hosting at home",
                "booking a restaurant",
                "a dinner for {people} friends",
            ),
            ("a DJ", "a playlist", "a party of {guests} people"),
            ("paper invitations", "a group message", "a seventieth birthday"),
            ("a Saturday", "a Friday evening", "an office party"),
        ],
        questions=[
            "How far ahead should I send wedding invitations?",
            "How much food do I need per guest for a buffet?",
            "What's a polite way to ask guests to RSVP?",
            "How long should a best man's speech be?",
        ],
        details=[
            "It's in {month}.",
            "The budget is about {big_money} in total.",
            "Some guests are vegan and one has a nut allergy.",
            "Some of the guests are bringing kids.",
            "The space only holds about {guests} people.",
        ],
    ),
    Domain(
        "car and commute",
        problems=[
            "my car makes a squealing noise when I brake",
            "a warning light came on and the manual doesn't explain it",
            "my bike chain keeps slipping when I go uphill",
            "my commute takes over an hour and I arrive exhausted",
            "I dread driving on the motorway",
            "my car battery goes flat if I don't drive it for a week",
        ],
        goals=[
            "cycle to work {per_week} days a week",
            "get ready for a {hours}-hour drive with young kids",
            "pass my driving test on the first try",
            "cut our household down to one car",
            "learn basic bike maintenance",
        ],
        choices=[
            ("an e-bike", "a regular bike", "a {minutes}-minute hilly commute"),
            ("a used petrol car", "a used electric car", "mostly city driving"),
            (
                "a monthly travel pass",
                "paying per trip",
                "going into the office {per_week} days a week",
            ),
            ("leasing a car", "buying one outright", "someone who drives a lot"),
        ],
        questions=[
            "How often should I check my tyre pressure?",
            "What does the engine warning light usually mean?",
            "How long do car batteries last?",
            "How do I fix a flat bike tyre?",
        ],
        details=[
            "I live in {city}.",
            "I drive about {hours} hundred kilometres a week.",
            "The car is from {year}.",
            "I'm not mechanical at all.",
            "I have to be at work by 8 am.",
        ],
    ),
]

# Sentences of anyone's life, for any domain.
GENERAL_DETAILS = [
    "I'm on a tight budget this month.",
    "I only have about {minutes} minutes a day for this.",
    "I'm a complete beginner.",
    "I tried once before and gave up after {days} days.",
    "I'd like something simple I can stick to.",
    "I've read a lot of conflicting advice online.",
    "I get overwhelmed easily, so keep it short.",
]

# "{D}" is up to two detail sentences (each ending with a space).
PROBLEM_SHAPES = [
    "{P}. What should I check first?",
    "{P}. {D}What could be causing it, and what should I try first?",
    "{P}. {D}What am I doing wrong?",
    "Can you help me figure out why {p}? {D}",
    "{P}, and I'm not sure why. {D}Where do I start?",
    "{D}{P}. Is this something I can sort out myself, or do I need help?",
    "{P}. Give me a checklist of things to try, easiest first.",
    "Any idea why {p}? {D}",
    "{P}. {D}What would you do in my place?",
    "Help: {p}. {D}What are the most likely causes?",
    "{P}. Explain what's probably going on as if I knew nothing about it, then "
    "tell me what to do.",
    "{P}. {D}Can you walk me through sorting it out step by step?",
    "{P}. How worried should I be, and what's a sensible next step?",
    "So {p}. {D}Is that normal?",
]
GOAL_SHAPES = [
    "I want to {g}. {D}How do I start?",
    "I'd like to {g}. {D}Can you make me a plan for the next {weeks} weeks?",
    "Plan out the next {weeks} weeks for me so I can {g}. {D}",
    "{D}What's the best way to {g}?",
    "We're hoping to {g}. Where should we begin?",
    "How should I prepare if I want to {g}? {D}",
    "Can you give me a checklist to help me {g}? {D}",
    "Is it realistic for me to {g}? {D}Be honest.",
    "What mistakes do people make when they try to {g}?",
    "I've decided to {g}. {D}What should the first week look like?",
    "Explain, like I'm new to all this, how to {g}. {D}",
    "My goal is to {g}. {D}Break it into small steps for me.",
    "How much time and money does it really take to {g}? {D}",
    "Our family wants to {g}. {D}What do we need to think about first?",
]
CHOICE_SHAPES = [
    "Should I go with {a} or {b} for {purpose}? {D}",
    "{D}Compare {a} and {b} for my case: {purpose}.",
    "Is {a} worth it compared with {b} for {purpose}? {D}",
    "I'm torn between {a} and {b} for {purpose}. {D}Which makes more sense?",
    "What are the trade-offs between {a} and {b} for {purpose}? {D}",
    "{A} or {b}? {D}It's for {purpose}. Help me decide.",
    "For {purpose}, would you pick {a} or {b}? {D}Explain your reasoning briefly.",
    "Pros and cons of {a} versus {b} for {purpose}, please. {D}",
    "We can't agree: {a} or {b}, for {purpose}? {D}Give us the main points on "
    "each side.",
]
QUESTION_SHAPES = [
    "{Q}",
    "Quick question: {q}",
    "{Q} Just a short answer, please.",
    "{D}{Q}",
    "{Q} Explain it simply.",
]
_FIELD = string.Formatter()
_SPACES = re.compile(r"\s+")
_SINGULAR = re.compile(r"\b(I|my|me|I'm)\b")
_PLURAL = re.compile(r"(We|Our)\b")


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _fill(text: str, rng: random.Random) -> str:
    """``text`` with each slot of :data:`SLOTS` filled by a seeded choice."""
    names = sorted({f for _, f, _, _ in _FIELD.parse(text) if f})
    return text.format(**{n: rng.choice(SLOTS[n]) for n in names})


def _details(domain: Domain, rng: random.Random) -> str:
    """Zero, one or two detail sentences, each followed by a space."""
    u = rng.random()
    if u < 0.25:
        return ""
    picked = [rng.choice(domain.details)]
    if u > 0.7:
        other = rng.choice(GENERAL_DETAILS + list(domain.details))
        if other != picked[0]:
            picked.append(other)
    return "".join(s + " " for s in picked)


def _tidy(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def _situations(domain: Domain) -> List[Tuple[str, dict, Sequence[str]]]:
    """``(situation, fields, shapes)`` of every problem, goal and choice."""
    out = []
    for p in domain.problems:
        out.append((p, {"p": p}, PROBLEM_SHAPES))
    for g in domain.goals:
        # A goal of "my" puppy is not a goal "we" or "our family" have.
        mine = _SINGULAR.search(g)
        shapes = [s for s in GOAL_SHAPES if not (mine and _PLURAL.match(s))]
        out.append((g, {"g": g}, shapes))
    for a, b, purpose in domain.choices:
        fields = {"a": a, "b": b, "purpose": purpose}
        out.append((f"{a} or {b} for {purpose}", fields, CHOICE_SHAPES))
    return out


class _Later(dict):
    """Format values that leave the slots of :data:`SLOTS` for :func:`_fill`."""

    def __missing__(self, name: str) -> str:
        return "{" + name + "}"


def _prompt(shape: str, fields: dict, domain: Domain, rng: random.Random) -> str:
    values = _Later(fields)
    values.update(
        P=_upper(fields.get("p", "")),
        A=_upper(fields.get("a", "")),
        D=_details(domain, rng),
    )
    # Every slot is filled in one pass, so a slot used twice reads the same.
    return _tidy(_fill(shape.format_map(values), rng))


def advice_prompts() -> List[Prompt]:
    """Every advice prompt (both splits), in a fixed order."""
    rng = random.Random("corpus:advice")
    out = []
    for domain in DOMAINS:
        for situation, fields, shapes in _situations(domain):
            source = f"advice:{domain.name}:{situation}"
            for _ in range(PER_SITUATION):
                text = _prompt(rng.choice(shapes), fields, domain, rng)
                out.append(user_prompt("advice", text, source))
        for q in domain.questions:
            source = f"advice:{domain.name}:{q}"
            for _ in range(PER_QUESTION):
                fields = {"Q": q, "q": q[:1].lower() + q[1:]}
                text = _prompt(rng.choice(QUESTION_SHAPES), fields, domain, rng)
                out.append(user_prompt("advice", text, source))
    return dedupe(out)
