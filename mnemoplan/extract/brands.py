"""What kind of thing a product or company name is: "Mazda CX-5" is a car, "Monzo" a bank.

A person seldom says "my car is a Mazda"; they say "the Mazda needs a service" or "bought a
Mazda CX-5". Typing a name by the words it is made of (a maker, a product line) lets a
statement about an owned thing be read without a cue word, the way "University of X" names a
university. The lists are common world knowledge: the widely sold makes and services of each
kind, not any conversation's values. Names that are also ordinary words or people's names
("Golf", "Bell", "Orange", "Sky", "Max") are left out: they need a cue to be read.
"""

from __future__ import annotations

import re

__all__ = ["brand_attribute"]

_KINDS: dict[str, str] = {
    "car": """Toyota Honda Ford Volkswagen VW BMW Mercedes Mercedes-Benz Audi Skoda Škoda Cupra Renault Peugeot
        Citroën Citroen Fiat Opel Vauxhall Volvo Saab Tesla Nissan Mazda Subaru Mitsubishi Suzuki Hyundai Kia Lexus
        Jeep Chevrolet Chevy Dodge Buick Cadillac Chrysler Porsche Jaguar Land_Rover Range_Rover Dacia
        Alfa_Romeo Lancia Polestar BYD Rivian Acura Infiniti Mahindra Maruti Proton Perodua Holden Corolla Camry
        Yaris Prius RAV4 Octavia Fabia Superb Fiesta Qashqai Passat Tiguan Clio Micra CX-5 CX-30 Outback Forester
        Impreza Miata Model_3 Model_Y Model_S Ioniq""",
    "phone": """iPhone Galaxy_S\\d+\\w* Galaxy_A\\d+\\w* Galaxy_Z_\\w+ Galaxy_Note\\w* Pixel Xiaomi Redmi Poco OnePlus
        Oppo Realme Huawei Motorola Moto_[A-Z]\\w* Nokia Fairphone Xperia BlackBerry Nothing_Phone""",
    "laptop": """MacBook ThinkPad IdeaPad Chromebook XPS Latitude Inspiron Surface_Laptop Surface_Pro Surface_Book
        Pavilion Spectre EliteBook ProBook ZenBook VivoBook Zephyrus Acer_Swift Acer_Aspire Aspire Framework_Laptop
        Razer_Blade Alienware Dell Lenovo iPad""",
    "streaming_service": """Netflix Hulu Disney\\+ HBO_Max HBO Prime_Video Amazon_Prime Apple_TV\\+? Paramount\\+
        Peacock Viaplay Canal\\+ Crunchyroll Mubi MUBI Britbox BritBox Hotstar Spotify Apple_Music Deezer Tidal
        YouTube_Music YouTube_Premium SoundCloud Audible""",
    "internet_provider": """Vodafone Telekom O2 Bouygues SFR BT Virgin_Media Plusnet TalkTalk Comcast Xfinity
        AT&T Verizon Fios Rogers Telus Optus Telstra Aussie_Broadband Telia Telenor Movistar Telefónica Ziggo KPN
        Swisscom Proximus Fastweb Jio Airtel Starlink Google_Fiber Hyperoptic Community_Fibre""",
    "bank": """Barclays Lloyds HSBC NatWest Santander Monzo Revolut Starling N26 DKB ING Commerzbank Sparkasse Rabobank
        ABN_AMRO BNP_Paribas Crédit_Agricole Chase Wells_Fargo Citibank Citi Capital_One Schwab Nordea SEB
        Swedbank Handelsbanken Bankinter BBVA CaixaBank Sabadell UniCredit Intesa Westpac ANZ NAB RBC Scotiabank BMO
        Nubank Amex American_Express Trade_Republic Chime Halifax Nationwide Wise Danske""",
    "gym": """PureGym Basic-Fit McFit Planet_Fitness Anytime_Fitness Virgin_Active David_Lloyd Equinox Orangetheory F45
        SATS Elixia John_Reed Gold's_Gym Snap_Fitness Fitness_Park Holmes_Place Urban_Sports_Club 24_Hour_Fitness""",
    "running_shoes": """Asics_Gel-\\w+ Gel-Nimbus Gel-Kayano Novablast Brooks_\\w+ Hoka Speedgoat
        Saucony Endorphin Kinvara Pegasus Vaporfly Invincible Ultraboost Adizero New_Balance FuelCell Cloudmonster
        Cloudflow Cloudsurfer Mizuno Wave_Rider Altra Salomon Speedcross""",
}
# In the lists, "_" is a space between the words of one name.
_SPACE = r"\s+"
_PATTERNS = [(kind, re.compile(r"(?<![\w+])(?:" + "|".join(w.replace("_", _SPACE) for w in words.split()) + r")(?![\w+])"))
             for kind, words in _KINDS.items()]


def brand_attribute(value: str) -> str:
    """The attribute a name's maker or product line gives away ("Kia EV6": car), or ""."""
    for kind, pattern in _PATTERNS:
        if pattern.search(value):
            return kind
    return ""
