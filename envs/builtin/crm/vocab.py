"""Word lists and the product catalogue the CRM generator draws from (gymflow.envs.builtin.crm.db)."""

from __future__ import annotations

import datetime as dt

FIRST = [
    "Ada",
    "Ben",
    "Chloe",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hugo",
    "Ines",
    "Jonas",
    "Kira",
    "Liam",
    "Maya",
    "Nils",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
    "Umar",
    "Vera",
    "Wes",
    "Yara",
    "Zoe",
    "Arjun",
    "Bea",
    "Caleb",
    "Dina",
    "Emil",
]
LAST = [
    "Adler",
    "Brandt",
    "Costa",
    "Duarte",
    "Eriksen",
    "Fischer",
    "Garcia",
    "Haddad",
    "Ito",
    "Jensen",
    "Kowalski",
    "Laine",
    "Moreau",
    "Novak",
    "Okafor",
    "Petrov",
    "Quist",
    "Rossi",
    "Sato",
    "Tanaka",
    "Ueda",
    "Varga",
    "Weber",
    "Xu",
    "Yilmaz",
    "Zamora",
]
COMPANY_A = [
    "Acme",
    "Globex",
    "Initech",
    "Umbrella",
    "Vandelay",
    "Hooli",
    "Tyrell",
    "Cyberdyne",
    "Soylent",
    "Wonka",
    "Stark",
    "Wayne",
    "Gringotts",
    "Oceanic",
    "Monarch",
    "Aperture",
    "Nakatomi",
    "Virtucon",
    "Prestige",
    "Sirius",
]
COMPANY_B = ["Logistics", "Foods", "Health", "Energy", "Retail", "Media", "Bank", "Labs"]
INDUSTRIES = ["retail", "healthcare", "finance", "manufacturing", "technology", "energy", "logistics", "media"]
REGIONS = ["north america", "europe", "asia pacific", "latin america"]
TIERS = ["gold", "silver", "bronze"]
TEAMS = ["billing", "technical", "returns", "onboarding"]
TITLES = ["Procurement Manager", "IT Director", "Office Manager", "CFO", "Operations Lead", "Buyer"]
STREETS = ["Maple Street", "Harbour Road", "Elm Avenue", "Station Lane", "Mill Close", "Park Drive"]
CITIES = ["Springfield", "Riverton", "Lakeside", "Fairview", "Brookfield", "Hillcrest"]
ORDER_STATUSES = ["delivered", "delivered", "delivered", "shipped", "processing", "cancelled"]
CASE_STATUSES = ["closed", "closed", "closed", "open", "pending"]
PRIORITIES = ["low", "medium", "high", "urgent"]
CHANNELS = ["chat", "email", "phone", "web"]
BUTTONS = ["power", "reset", "mode", "function"]
COLOURS = ["green", "amber", "blue", "white"]
START = dt.datetime(2024, 1, 1)
DAYS = 547
"""Cases and orders fall between START and START + DAYS (to the end of June 2025)."""

# (category, product names, issues the customer reports, the team that handles them)
CATALOGUE = [
    ("router", ["Nimbus Router X2", "Nimbus Router Mesh", "Strato Gateway 5", "Strato Gateway Lite"], "technical"),
    ("laptop", ["Orbit Book 13", "Orbit Book Pro 15", "Kestrel Ultrabook", "Kestrel Workstation"], "technical"),
    ("printer", ["Inkwell Jet 300", "Inkwell Laser 900", "Quill Office Printer", "Quill Photo Printer"], "returns"),
    ("headset", ["Echo Buds Pro", "Echo Studio Headset", "Lark Call Headset", "Lark Sport Earbuds"], "returns"),
    ("monitor", ["Vista 27 Display", "Vista 32 Curved", "Prism 24 Monitor", "Prism Touch 22"], "onboarding"),
    ("software", ["LedgerOne Suite", "LedgerOne Payroll", "Beacon CRM Seats", "Beacon Analytics"], "billing"),
]
ISSUES = {
    "router": [
        "my {p} keeps dropping the Wi-Fi connection every few minutes",
        "the {p} will not accept the new firmware update and shows a red light",
        "devices connected to the {p} get no internet although the cable is fine",
    ],
    "laptop": [
        "my {p} shuts down by itself when the battery is still at forty percent",
        "the keyboard of the {p} stopped working after the last system update",
        "the {p} fan is very loud even when nothing is running",
    ],
    "printer": [
        "the {p} prints blank pages although the cartridges are new",
        "the {p} jams on every second sheet of paper",
        "the {p} arrived with a cracked paper tray and I want to send it back",
    ],
    "headset": [
        "the left earpiece of the {p} has no sound at all",
        "the {p} disconnects from my phone whenever I walk away from the desk",
        "the microphone of the {p} makes me sound robotic on calls",
    ],
    "monitor": [
        "the {p} shows flickering horizontal lines after it warms up",
        "the {p} is not detected by my docking station",
        "I cannot find how to mount the {p} on our wall brackets",
    ],
    "software": [
        "we were charged twice for the {p} subscription this month",
        "the invoice for the {p} lists more seats than we ordered",
        "our {p} licence key is rejected after the renewal",
    ],
}
