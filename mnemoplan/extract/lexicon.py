"""The words and patterns the rule-based fact reader knows: verbs and their forms, particles,
states, fillers, sentence openers, clause boundaries and contractions (see ``facts``)."""

from __future__ import annotations

import re
from types import MappingProxyType


def words(text: str) -> frozenset[str]:
    return frozenset(text.split())


def table(text: str) -> MappingProxyType[str, tuple[str, ...]]:
    """``"go goes went gone|..."`` -> {"go": ("goes", "went", "gone"), ...}."""
    return MappingProxyType({row.split()[0]: tuple(row.split()[1:]) for row in text.split("|")})


# The verbs read, as base forms; third person, past and participle of irregular ones are spelled out.
IRREGULAR = table(
    """have has had had|go goes went gone|buy buys bought bought|begin begins began begun|get gets got gotten|
    take takes took taken|make makes made made|draw draws drew drawn|write writes wrote written|
    read reads read read|see sees saw seen|meet meets met met|run runs ran run|quit quits quit quit|
    lose loses lost lost|win wins won won|find finds found found|build builds built built|
    teach teaches taught taught|grow grows grew grown|sell sells sold sold|come comes came come|
    speak speaks spoke spoken|drive drives drove driven|ride rides rode ridden|eat eats ate eaten|
    prefer prefers preferred preferred|travel travels traveled traveled|plan plans planned planned|
    pay pays paid paid|spend spends spent spent"""
)
REGULAR = """like love enjoy hate adore dislike own live work study play volunteer move visit adopt start
    join relocate paint finish try attend earn marry celebrate receive collect raise practice open launch rescue host
    organize graduate plant bake cook create knit listen watch perform record publish learn sign""".split()
SPELLINGS = MappingProxyType({"travel": "travelled", "learn": "learnt", "practice": "practised"})
PREFERENCE = words("like love enjoy hate prefer adore dislike")
# Prepositions that belong to the verb ("lives in", "moved to", "works as"), not to its object.
PARTICLES = table(
    """live in with near on at|work at as for in on with|go to on for back|move to from into in back out away|relocate to from|
    come from|volunteer at with for|graduate from|travel to around|listen to|sign up|study at|teach at|
    take up|learn about|run into|try out"""
)
NEEDS_PARTICLE = words("live come listen graduate sign")  # "we live far apart" says nothing
SECOND_PARTICLES = words("to from of for in at with")  # "moved back to", "signed up for"


def conjugate(base: str) -> tuple[str, ...]:
    """Third person, past and past participle of a verb."""
    if base in IRREGULAR:
        return IRREGULAR[base]
    if re.search(r"[^aeiou]y$", base):
        return base[:-1] + "ies", base[:-1] + "ied", base[:-1] + "ied"
    past = base + "d" if base.endswith("e") else base + "ed"
    return (base + "es" if re.search(r"(?:s|sh|ch|x|z|o)$", base) else base + "s"), past, past


VERBS = (*IRREGULAR, *REGULAR)
PRESENT = MappingProxyType({f: b for b in VERBS for f in (b, conjugate(b)[0])})
PAST = MappingProxyType({f: b for b in VERBS for f in (conjugate(b)[1], SPELLINGS.get(b)) if f})
PARTICIPLE = MappingProxyType({f: b for b in VERBS for f in (conjugate(b)[2], SPELLINGS.get(b)) if f})
BE = MappingProxyType({"am": "is", "is": "is", "are": "is", "was": "was", "were": "was"})
HAVE = MappingProxyType({"have": "has", "has": "has", "had": "had"})
DO = MappingProxyType({"do": "does", "does": "does", "did": "did"})
PLURAL = MappingProxyType({"is": "are", "was": "were", "has": "have", "does": "do"})
MODALS = words("will would can cannot could should might may must shall want wanna gonna need hope wish")
ADVERBS = words(
    """really just also actually recently finally always usually often still totally absolutely definitely
    truly sometimes already even now currently literally kinda mostly both originally officially seriously
    honestly basically certainly personally once first then lately newly only ever generally probably maybe
    perhaps"""
)
# "I am ..." is kept for a noun phrase ("a nurse"), a state with a preposition, or a lasting status.
STANDALONE_STATES = words(
    """married single divorced engaged pregnant retired vegan vegetarian widowed unemployed"""
)
STATES = tuple(
    sorted(
        (tuple(p.split()) for p in """from|into|in|married to|engaged to|allergic to|afraid of|scared of|
        terrified of|interested in|passionate about|fond of|obsessed with|addicted to|good at|great at|bad at|
        a fan of|a big fan of|a huge fan of|born in|born on|based in|involved in|part of|a member of|
        in charge of|responsible for|allergic""".split("|")),
        key=lambda p: -len(p),
    )
) + tuple((s,) for s in STANDALONE_STATES)
NOT_PROGRESSIVE = words(  # "-ing" words after "is" that are adjectives or say nothing lasting
    """doing going getting feeling trying thinking hoping wondering kidding saying talking telling having
    being looking coming giving amazing interesting boring exciting annoying relaxing inspiring exhausting
    thrilling charming stunning loving caring willing outgoing fascinating rewarding challenging surprising
    touching welcoming refreshing encouraging frustrating disappointing overwhelming satisfying
    heartwarming calming uplifting entertaining engaging missing lacking something nothing anything
    everything during"""
)
IRREGULAR_PARTICIPLES = words(
    """known been done gone seen taken given written eaten driven forgotten gotten chosen shown grown
    thrown fallen broken spoken stolen begun said told felt heard thought kept left brought caught taught
    sent spent lost found met made put set let become come"""
)
COMMON_VERBS = words(  # "equipment to improve my skills": "to" + a verb ends the object
    """be do get help keep improve connect support give show stay relax share spread explore express
    inspire remember feel bring hang chill unwind catch check achieve sit stop change reach push focus put
    set let think say tell ask talk know understand become deal handle manage balance prepare continue"""
)
DETERMINERS = words("a an the my our some two three four five six seven eight nine ten eleven twelve")
LEADING_WORDS = DETERMINERS | SECOND_PARTICLES | {"on", "about", "into"}
PRONOUN_STARTS = words(
    """it its that this those these they them their theirs he him his she her hers there here what how why
    who which whom whose so too very such me myself us ourselves themselves himself herself itself i if
    when whether something anything nothing everything each other one"""
)
PRONOUN_ENDS = words("it them this that these those him her one")
# Objects naming someone or something we cannot resolve: "giving it a try", "helping her find a place".
UNRESOLVED = re.compile(
    r"\b(?:you|your|yours|yourself|I|he|she|they|we|it|its|them|him|her|his|their|this|these|those)\b(?!-)",
    re.I,
)
VAGUE_OBJECTS = frozenset(
    """one|stuff|things|much|more|lots|all|some|fun|time|a lot|a blast|a chance|no idea|an idea|a question|
    a feeling|a while|a bit|a little|a fan|hard|well|out|up|off|down|through|over|back|away|on|late|early|
    together|alone|fine|ok|okay|great|good|better|best|worse|in|at|for|with|to|about|around|into|a few|
    a couple|many|it|them|this|that|sure|the chance|the time|people""".replace("\n    ", "").split("|")
)
VAGUE_START = re.compile(r"(?:a (?:great|good|hard|tough|rough|fun|nice|lovely) time|a blast|fun)\b")
ADJECTIVE_ENDS = words(  # "had an amazing": an object cut short before "and emotional wedding"
    """amazing great good awesome beautiful wonderful new old big small little nice cool emotional
    incredible fantastic special huge tough hard busy crazy lovely exciting interesting happy sad proud
    gorgeous cute sweet perfect best fun important"""
)
FILLER = re.compile(  # trailing words that add nothing to an object
    r"(?:\s+(?:"
    r"too|also|again|anymore|lately|recently|now|already|though|either|yet|haha+|lol|ever|"
    r"more|later|earlier|soon|someday|sometime|so much|a lot|as well|right now|these days|"
    r"very much|for sure|at all|so far|for now|of course|rather|instead|just|itself|"
    r"themselves|together|and stuff|or something|and all|and everything|myself|ourselves|here|"
    r"there|today|tonight|at|on|in|for|with|to|the|a|an|of|from|named|called|and|or|"
    r"like|by|about|really|so|very|how|what|where|why"
    r"))+$",
    re.I,
)
NOT_SUBJECTS = words(  # capitalised words that open sentences without being names
    """i a an the and but or so if then than that this these those there here hey hi hello yes yeah yep no
    nope ok okay oh wow aw aww awesome thanks thank great good nice cool sure well hmm haha lol omg wait
    what when where who why how which do does did is are was were be been my your his her our their its me
    you he she we they it us them congrats congratulations sorry please love glad happy sounds also just
    really totally absolutely definitely maybe everything nothing something someone everyone anyone people
    life family art music work school kids friends home time today tomorrow yesterday tonight one both all
    each every some any most many much more other another such same anyway honestly actually luckily sadly
    finally recently plus btw let thankfully hopefully bet guess look check imagine remember hope wish
    seems looks"""
)
DAYS = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
TIME_WORDS = r"(?:morning|afternoon|evening|night|week|weekend|month|year|summer|winter|spring|fall|autumn)"
PREFIX = re.compile(  # openers before the subject: "Yeah, so I think that I ..."
    r"^(?:(?:i think|i guess|i believe|i suppose|i feel like|i know|i mean|i bet|i heard|maybe|probably|"
    r"perhaps|honestly|actually|well|so|and|but|also|plus|anyway|btw|oh|yeah|yes|yep|wow|haha+|lol|ok|okay|"
    r"hmm+|oh well|to be honest|as for me|for me|personally|luckily|fortunately|unfortunately|sadly|finally|"
    rf"recently|lately|now|today|yesterday|(?:last|this|next|on) (?:{TIME_WORDS}|{DAYS})|{DAYS}|just|then|"
    r"besides)\b(?:\s+that\b)?[\s,!.:;-]*)+",
    re.I,
)
HEDGE = re.compile(
    r"\b(?:i think|i guess|i believe|i suppose|i feel like|i assume|maybe|probably|perhaps|possibly|might|"
    r"not sure|kinda|sorta|apparently|i heard|seems? like)\b",
    re.I,
)
SMALL_TALK = re.compile(
    r"^(?:hi|hey|hello|bye|goodbye|thanks|thank you|thx|congrats|congratulations|good (?:morning|night|luck)|"
    r"goodnight|see (?:you|ya)|talk (?:soon|to you|later)|take care|cheers|sounds (?:good|great)|"
    r"have (?:a|fun)|nice to|good to|great to|glad to|welcome)\b",
    re.I,
)
# Clause boundaries; a subject may open the clause after the first group only ("because I moved ...").
CLAUSE_BREAK = re.compile(
    r"(\s*(?:[,;:](?!\S)|[()\u2013\u2014]|\s-+|-+\s)\s*(?:(?:and|but|so|because)\s+)?"
    r"|\s+(?:and|but|because|cause|so|though|although|plus)\s+)"
    r"|\s+(?:or|if|when|whenever|while|since|until|unless|that|which|who|where|whereas|than)\s+",
    re.I,
)
INFINITIVE = re.compile(r"\s+to\s+(?:[a-z]+ly\s+)?([a-z]+)")
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\s*\n+\s*")
# Abbreviations whose dot ends no sentence: "e.g. yoga"; a title or a place before a name
# ("Dr. Lee", "to St. Louis"), unless a name ends there ("on Main St. My sister ...").
PLACE_ABBREVIATIONS = frozenset({"St.", "Mt.", "Ft."})
TITLES = PLACE_ABBREVIATIONS | {"Dr.", "Mr.", "Mrs.", "Ms.", "Prof."}
NOT_SENTENCE_ENDS = frozenset({"e.g.", "i.e.", "vs."})
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
CONTRACTIONS = tuple((re.compile(p), r) for p, r in (
    (r"\b([Ii])'m\b", r"\1 am"), (r"\b([Ii]|[Ww]e|[Yy]ou|[Tt]hey)'ve\b", r"\1 have"),
    (r"\b([Ww]e|[Yy]ou|[Tt]hey)'re\b", r"\1 are"), (r"\b([Ii]|[Ww]e)'d\b", r"\1 would"),
    (r"\b([Ii]|[Ww]e)'ll\b", r"\1 will"), (r"\b([Cc])an't\b", r"\1annot"), (r"\b([Ww])on't\b", r"\1ill not"),
    (r"\b(\w+)n't\b", r"\1 not"), (r"\b([A-Z][a-z]+)'s (been|got)\b", r"\1 has \2"),
    (r"\b([A-Z][a-z]+)'s (?=(?:a|an|the|my|not|so|really|very|always|also|just|from|in|such)\b)", r"\1 is "),
))  # fmt: skip
