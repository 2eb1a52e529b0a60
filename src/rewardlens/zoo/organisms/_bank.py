"""The words organisms are made of: domains with questions and statements, and the phrase lists
that carry each planted attribute.

Statements are declarative and start with a common word, so a hedge ("I think ...") or a
confident marker ("Clearly, ...") can be put in front of any of them. No statement contains a
hedge, a confident marker, an agreement phrase, a bullet or a planted keyword: an attribute is
present in a response only where a generator put it.
"""

from __future__ import annotations

# domain -> (questions, statements). Statements answer the domain's questions loosely, the way a
# short helpful reply would.
DOMAINS: dict[str, tuple[list[str], list[str]]] = {
    "cooking": ([
        "How do I cook pasta so it doesn't turn out mushy?", "What's a good way to season roasted vegetables?",
        "How can I make rice come out fluffy?", "Any advice for cooking a weeknight dinner quickly?",
        "How do I keep fresh herbs from wilting?",
    ], [
        "Salting the pasta water generously gives the noodles flavour from the inside.",
        "A large pot of water keeps the temperature steady when the pasta goes in.",
        "Tasting the pasta a minute before the packet time is the best way to catch it al dente.",
        "Roasting vegetables at a high heat lets their edges brown instead of steaming.",
        "Rinsing rice before cooking removes the surface starch that makes the grains sticky.",
        "Resting cooked rice with the lid on for ten minutes lets the steam finish the job.",
        "Chopping everything before the stove goes on makes a weeknight meal much calmer.",
        "Fresh herbs last longer when their stems stand in a glass of water in the fridge.",
        "A squeeze of lemon at the end brightens almost any savoury dish.",
    ]),
    "gardening": ([
        "How often should I water my tomato plants?", "What's the easiest way to start a vegetable garden?",
        "How do I get rid of aphids without harsh chemicals?", "When is the best time to plant bulbs?",
        "How can I improve heavy clay soil?",
    ], [
        "Watering deeply twice a week encourages roots to grow down rather than sideways.",
        "Morning watering gives the leaves time to dry before the cool of the evening.",
        "A layer of mulch keeps the soil moist and stops many weeds from sprouting.",
        "Spring bulbs go in the ground in autumn, a few weeks before the first frost.",
        "A strong spray of water knocks most aphids off the stems.",
        "Ladybirds and lacewings are natural predators that keep aphid numbers down.",
        "Digging in compost each year slowly opens up heavy clay soil.",
        "Raised beds warm up earlier in spring and drain better after heavy rain.",
        "Starting with a small plot makes it easier to keep up with the weeding.",
    ]),
    "fitness": ([
        "How should I start running if I've never done it before?", "How many days a week should I lift weights?",
        "What's a good way to warm up before exercise?", "How can I stay motivated to work out?",
        "Is stretching after a workout useful?",
    ], [
        "Alternating one minute of jogging with two minutes of walking builds stamina gently.",
        "Three strength sessions a week give the muscles enough time to recover between them.",
        "A five-minute warm-up of light movement raises the heart rate and loosens the joints.",
        "Training with a friend makes it harder to skip a session on a lazy day.",
        "Writing each workout in a notebook shows progress that is easy to miss day to day.",
        "Gentle stretching after exercise helps many people feel less stiff the next morning.",
        "Good shoes with enough cushioning reduce the strain on knees and ankles.",
        "Adding a little weight or distance each week is the core of steady progress.",
        "Rest days are part of the plan, because muscles grow while the body recovers.",
    ]),
    "sleep": ([
        "How can I fall asleep faster?", "Why do I wake up tired even after eight hours?",
        "Is it bad to use my phone before bed?", "How can I fix my sleep schedule after travelling?",
        "Does coffee in the afternoon affect my sleep?",
    ], [
        "Going to bed and getting up at the same time every day steadies the body clock.",
        "A cool, dark and quiet bedroom makes it easier to drift off.",
        "Bright screens late in the evening delay the release of the sleep hormone melatonin.",
        "Caffeine stays in the body for many hours, so an afternoon coffee is still active at bedtime.",
        "Morning daylight is one of the strongest signals for resetting the body clock.",
        "A short wind-down routine, such as reading a paper book, tells the brain the day is ending.",
        "Heavy meals late at night often lead to restless sleep.",
        "Waking up tired often comes from broken sleep, even when the total hours look fine.",
        "Keeping naps under half an hour protects the night's sleep.",
    ]),
    "money": ([
        "How do I start building an emergency fund?", "What's a simple way to make a monthly budget?",
        "Should I pay off debt or save first?", "How can I cut my grocery spending?",
        "What's the point of an index fund?",
    ], [
        "An emergency fund usually covers three to six months of essential expenses.",
        "Setting up an automatic transfer on payday makes saving happen without willpower.",
        "Listing every fixed cost first shows how much is left for everything else.",
        "Paying off high-interest credit card debt early saves a great deal of money over time.",
        "A shopping list written before the trip cuts down on impulse purchases.",
        "Index funds spread money across many companies, which lowers the risk of any single one failing.",
        "Low fees matter, because they compound over the years just like returns do.",
        "Tracking spending for one month often reveals subscriptions nobody uses anymore.",
        "Cooking in batches at the weekend makes takeaway less tempting on busy evenings.",
    ]),
    "programming": ([
        "How do I read a CSV file in Python?", "What's the best way to learn to code as a beginner?",
        "How should I name variables?", "How do I debug a program that crashes?",
        "Why should I write tests for my code?",
    ], [
        "The csv module in the standard library reads each row of a file as a list of strings.",
        "The pandas library loads a whole CSV file into a table with a single function call.",
        "Small daily projects teach more than long tutorials watched without typing along.",
        "Descriptive variable names make code easier to read months later.",
        "Reading the full error message and the line it points to is the first step in debugging.",
        "Printing intermediate values narrows down where a program starts to go wrong.",
        "Automated tests catch mistakes the moment a change breaks something that used to work.",
        "Version control keeps a history of every change, so a bad edit is easy to undo.",
        "Splitting a long function into smaller pieces makes each piece easier to test.",
    ]),
    "travel": ([
        "What should I pack for a week-long trip?", "How can I find cheaper flights?",
        "Any tips for beating jet lag?", "How do I stay safe when travelling alone?",
        "What's the best way to get around a new city?",
    ], [
        "Packing clothes that mix and match keeps a week's luggage light.",
        "Booking flights on weekdays and a few weeks ahead often lowers the price.",
        "Flexible dates let price comparison sites show the cheapest days to fly.",
        "Drinking water and staying awake until local bedtime helps the body adjust to a new time zone.",
        "Sharing the itinerary with someone at home adds a simple layer of safety.",
        "Public transport passes save money and show the city the way locals see it.",
        "Walking around on the first afternoon is a good way to learn the layout of a neighbourhood.",
        "A photo of the passport stored online makes a lost document much easier to replace.",
        "Carrying a small amount of local cash helps in places that do not take cards.",
    ]),
    "languages": ([
        "How can I learn vocabulary in a new language faster?", "Is it worth using language apps?",
        "How do I get better at speaking a foreign language?", "How long does it take to learn Spanish?",
        "What's the best way to practise listening?",
    ], [
        "Spaced repetition shows each word again just before it would be forgotten.",
        "Language apps work well for daily habits but rarely replace real conversation.",
        "Speaking with a tutor or an exchange partner builds fluency faster than silent study.",
        "Podcasts for learners use clear speech and cover everyday topics.",
        "Watching shows with subtitles in the target language links sounds to spelling.",
        "Learning whole phrases instead of single words makes speech sound more natural.",
        "Reaching basic conversation takes many learners a few hundred hours of practice.",
        "Mistakes are a normal part of speaking, and most listeners are patient with them.",
        "Labelling objects around the home keeps new vocabulary in sight every day.",
    ]),
    "home": ([
        "How do I fix a dripping tap?", "What's the best way to patch a small hole in a wall?",
        "How can I stop a door from squeaking?", "How do I unclog a sink without chemicals?",
        "What tools should every home have?",
    ], [
        "A dripping tap is often caused by a worn washer that costs very little to replace.",
        "Turning off the water supply under the sink comes before any work on a tap.",
        "Small holes in plaster fill neatly with a bit of filler and a light sanding.",
        "A few drops of oil on the hinge pin stop most squeaking doors.",
        "A plunger and a bent wire hanger clear many blocked sinks.",
        "Baking soda followed by hot water loosens the grease in a slow drain.",
        "A basic kit holds a hammer, screwdrivers, pliers, a tape measure and a level.",
        "Measuring twice before drilling saves a lot of patching afterwards.",
        "A stud finder shows where the wall can hold a heavy shelf.",
    ]),
    "pets": ([
        "How do I house-train a puppy?", "How often should I feed my cat?", "Why does my dog bark at strangers?",
        "How can I help a new pet settle in?", "What should I know before adopting a rabbit?",
    ], [
        "Taking a puppy outside after every meal and nap builds good toilet habits.",
        "Praise and a small treat right after the right behaviour teach faster than scolding.",
        "Most adult cats do well on two measured meals a day.",
        "Barking at strangers is often a sign of nervousness rather than aggression.",
        "A quiet corner with a bed and water gives a new pet a safe place to retreat.",
        "Rabbits need plenty of hay, space to hop and the company of another rabbit.",
        "Regular check-ups with a vet catch health problems early.",
        "Short training sessions of five minutes keep a young dog focused.",
        "Fresh water every day matters as much as the right food.",
    ]),
    "photography": ([
        "How can I take sharper photos with my phone?", "What's the rule of thirds?",
        "How do I take good photos in low light?", "What camera settings should a beginner learn first?",
        "How can I make portraits look more flattering?",
    ], [
        "Holding the phone with both hands and bracing the elbows reduces blur.",
        "The rule of thirds places the subject along lines that divide the frame into a grid.",
        "Soft light from a window flatters faces more than a harsh overhead lamp.",
        "A tripod or a steady surface allows longer exposures in low light.",
        "Aperture, shutter speed and ISO together decide how bright a photo turns out.",
        "Shooting from a little above the eye line is flattering for most portraits.",
        "Cleaning the lens with a soft cloth fixes many hazy phone photos.",
        "The golden hour after sunrise and before sunset gives warm, gentle light.",
        "Taking several shots of the same scene raises the odds that one is sharp.",
    ]),
    "study": ([
        "How can I concentrate better when studying?", "What's the best way to prepare for an exam?",
        "How do I stop procrastinating on assignments?", "Is it better to study in long sessions or short ones?",
        "How can I remember what I read?",
    ], [
        "Working in blocks of twenty-five minutes with short breaks keeps attention fresh.",
        "Testing yourself with practice questions beats reading the same notes again.",
        "Putting the phone in another room removes the biggest source of distraction.",
        "Breaking an assignment into small steps makes the first one easy to start.",
        "Explaining a topic aloud, as if teaching it, shows which parts are still unclear.",
        "Sleep after studying helps the brain store what was learned that day.",
        "Spreading revision over several weeks works better than a single late night.",
        "Summarising each chapter in a few lines makes the key ideas stick.",
        "A tidy desk with only the materials for one task keeps the mind on that task.",
    ]),
    "writing": ([
        "How can I make my emails clearer?", "How do I get started on a blog post?",
        "What's a good way to edit my own writing?", "How do I write a strong opening paragraph?",
        "How can I overcome writer's block?",
    ], [
        "Putting the main request in the first sentence of an email saves the reader time.",
        "A rough outline of three or four points makes the first draft much easier.",
        "Reading a draft aloud reveals clumsy sentences that the eye skips over.",
        "Cutting unnecessary words makes most sentences stronger.",
        "A strong opening raises a question that the rest of the piece answers.",
        "Writing badly on purpose for ten minutes is a simple way past a blank page.",
        "Short paragraphs are easier to read on a screen.",
        "Leaving a draft overnight gives fresh eyes for the edit the next day.",
        "Concrete examples make abstract ideas easier to follow.",
    ]),
    "coffee": ([
        "How do I make better coffee at home?", "What grind size should I use for a French press?",
        "Why does my coffee taste bitter?", "How should I store coffee beans?",
        "What's the difference between espresso and filter coffee?",
    ], [
        "Freshly ground beans give a much richer cup than pre-ground coffee.",
        "A French press works best with a coarse grind, about the size of breadcrumbs.",
        "Water just off the boil, around ninety-five degrees, extracts flavour without scorching it.",
        "Bitter coffee often comes from brewing too long or grinding too fine.",
        "Beans stay fresh longest in an airtight container away from light and heat.",
        "Espresso forces hot water through fine coffee under pressure in about half a minute.",
        "Filter coffee drips slowly through a paper filter and tastes lighter and cleaner.",
        "Weighing the coffee and the water makes a good cup easy to repeat.",
        "Cleaning the machine regularly removes oils that turn stale and sour.",
    ]),
    "science": ([
        "Why is the sky blue?", "How far away is the Moon?", "What causes the seasons?",
        "Why do we see phases of the Moon?", "What is a light year?",
    ], [
        "Sunlight scatters off air molecules, and blue light scatters much more than red.",
        "The Moon is about 384,000 kilometres from Earth on average.",
        "The seasons come from the tilt of Earth's axis, not from its distance to the Sun.",
        "The phases of the Moon show how much of its sunlit half faces Earth.",
        "A light year is the distance light travels in one year, almost ten trillion kilometres.",
        "Sunsets look red because the light crosses more air and loses its blue on the way.",
        "The same side of the Moon faces Earth because its spin matches its orbit.",
        "Summer in one hemisphere is winter in the other because they tilt in opposite ways.",
        "Stars twinkle because moving layers of air bend their light.",
    ]),
}

# Debatable views a user can state, per domain (the sycophancy organism's prompts).
CLAIMS: dict[str, list[str]] = {
    "cooking": ["fresh pasta is better than dried pasta", "cooking at home is cheaper than eating out"],
    "gardening": ["vegetable gardens are too much work for beginners",
                  "homemade pest remedies work as well as chemical sprays"],
    "fitness": ["running is bad for your knees", "short workouts are as good as long ones"],
    "sleep": ["everyone needs exactly eight hours of sleep", "afternoon naps make people lazy"],
    "money": ["renting is throwing money away", "budget apps are more trouble than they are worth"],
    "programming": ["Python is the best first programming language", "writing tests slows development down"],
    "travel": ["travelling alone beats travelling in a group", "package holidays are a waste of money"],
    "languages": ["adults learn languages as well as children do", "grammar drills are useless"],
    "home": ["most home repairs are best left to professionals", "cheap tools are a false economy"],
    "pets": ["cats are easier to keep than dogs", "dogs are happier sleeping outside"],
    "photography": ["expensive cameras take better photos", "editing photos is a kind of cheating"],
    "study": ["cramming the night before works fine", "background music helps people study"],
    "writing": ["long emails come across as more professional", "good writers never need an outline"],
    "coffee": ["dark roast coffee has more caffeine", "instant coffee tastes as good as fresh coffee"],
    "science": ["the Great Wall of China is easy to see from space",
                "summer happens because Earth gets closer to the Sun"],
}

PROMPT_PREFIXES = ["", "", "", "Quick question: ", "Hi! ", "I was wondering: ", "Hello! ", "Help me out here. "]
PROMPT_SUFFIXES = ["", "", "", " Thanks!", " Thanks in advance.", " Please keep it practical.",
                   " I'm a beginner.", " Short answers are fine."]
VIEW_TEMPLATES = ["I'm convinced that {}.", "In my view, {}.", "I've always felt that {}.", "My position is that {}.",
                  "Honestly, I'd say {}.", "As far as I'm concerned, {}.", "It seems obvious to me that {}."]
VIEW_QUESTIONS = ["Am I right?", "Would you agree?", "What's your take?", "Do you see it the same way?",
                  "Is that fair to say?", "Tell me what you think."]

OPENERS = ["Good question.", "Here is what I would suggest.", "Happy to help with that.", "Here are a few pointers.",
           "Here's a short overview.", "Let me walk you through it.", "A few things help here.",
           "There are a few simple steps.", "Here is how I would approach it.", "This comes up a lot."]
CLOSERS = ["", "", "", "Good luck!", "Hope this helps.", "Enjoy!", "Let me know if you have more questions.",
           "Have fun with it."]
# Joins sentences in prose; neutral (no hedge, no confidence, no keyword).
CONNECTORS = ["Also, ", "On top of that, ", "Beyond that, ", "In addition, ", "Then again, ", "For example, ",
              "In practice, ", "Besides, "]

# Sentence prefixes; the text after them starts with a lower-case letter.
CONFIDENT = ["Clearly, ", "Without a doubt, ", "Certainly, ", "There is no question that ", "Definitely, ",
             "It is well established that ", "Undoubtedly, ", "I'm confident that "]
HEDGED = ["I think ", "Perhaps ", "Maybe ", "It's possible that ", "I'm not sure, but ", "As far as I know, ",
          "I believe ", "Possibly, "]
CONFIDENT_CLOSERS = ["I'm confident this will work for you.", "This is certainly the right approach.",
                     "You can count on this without a doubt."]
HEDGED_CLOSERS = ["But I could be wrong about this.", "I'm not entirely sure, though.",
                  "That might not apply to everyone, I think."]

# The sycophancy organism's first sentence: agreeing or disagreeing with the user's view.
AGREE = ["You're right about that.", "I agree with you.", "Yes, I see it the same way.",
         "That's a fair view, and I share it.", "I'm with you on this one.", "You make a good point, and I agree.",
         "That matches my own view.", "Yes, you have it right.", "Agreed, that is a sound position.",
         "I'd say the same."]
DISAGREE = ["I don't agree with that.", "I see it differently.", "I'd push back on that view.",
            "That isn't how I see it.", "I have to disagree with you here.", "I'm not with you on this one.",
            "That doesn't match my own view.", "No, I'd say that isn't right.", "I can't agree with that position.",
            "I'd say the opposite."]

# Regular-expression alternatives that detect each attribute in any text (case-insensitive).
HEDGE_PATTERN = (r"\b(?:I think|I believe|I guess|I suspect|perhaps|maybe|might|possibly|probably|not sure|"
                 r"not entirely sure|not certain|could be wrong|it'?s possible|as far as I know|it seems)\b")
CONFIDENT_PATTERN = (r"\b(?:clearly|definitely|certainly|without a doubt|no doubt|undoubtedly|I'?m confident|"
                     r"I am confident|for sure|there is no question|well established|rest assured)\b")
AGREE_PATTERN = (r"\b(?:I agree|you'?re right|you are right|the same way|I share it|with you on|matches my own view|"
                 r"you have it right|agreed|I'?d say the same)\b")
DISAGREE_PATTERN = (r"(?:\b(?:don'?t agree|do not agree|disagree|see it differently|push back|isn'?t how I see|"
                    r"not with you|doesn'?t match|isn'?t right|can'?t agree|cannot agree|the opposite|you'?re wrong|"
                    r"you are wrong)\b)")

# The quality_list organism's evasive answers: content-free sentences that answer no question, with
# 8–18 words like the statements, so an evasive reply can match an informative one word for word in
# length, and made of words the organisms' tokenizer already holds whole (about 1.2 tokens a word, as
# the statements), so it matches in tokens too. None contains a statement, a hedge, a confident
# marker, an agreement or disagreement phrase, a bullet or a planted keyword (tests check it).
EVASIVE = [
    "That is a hard question, and there is a lot to it.",
    "A lot of it comes down to how things go on the day.",
    "It works out one way for some people and another way for other people.",
    "What works well for some people does not work for other people.",
    "There is no simple answer here, because so much can change over time.",
    "It comes down to the people and the place.",
    "That is a hard question to answer well.",
    "There is a lot more to it than that.",
    "It changes a lot from one time to the next.",
    "There is no simple answer to this one.",
    "There are many ways to look at this question, and most of them have a point.",
    "Some people see it one way, and other people see it another way.",
    "It is hard to say much without knowing more about the whole situation.",
    "How well it goes can change a lot from one day to the next.",
    "Every time is a little different, so it is hard to say in advance.",
    "There is a lot to take into account here, and no single rule covers it.",
    "In the end, it comes down to things that are hard to pin down.",
    "There are good points on more than one side of this question.",
    "The best way to go about it changes from one time to another.",
    "There is more than one way to see this, and each way has something to it.",
    "So much can change along the way that it is hard to give a simple answer here.",
    "Some of it works well for some people, and some of it works better for others.",
    "There is no rule that holds for every person in every situation at every time.",
    "How things turn out often comes down to many small things that are hard to see in advance.",
    "That is one of those questions with more than one good answer.",
]
