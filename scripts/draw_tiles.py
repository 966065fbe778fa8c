"""Draws the tile images in envs_visual/assets/ (run once; the PNGs are committed).

Each tile is TILE_PX square; the renderer resizes it to the env's cell size. Colours are chosen so
that every tile kind differs from the others in hue and shape at 28 px.
Usage: python scripts/draw_tiles.py
"""

from pathlib import Path

from PIL import Image, ImageDraw

TILE_PX = 56
ASSETS = Path(__file__).resolve().parents[1] / "envs_visual" / "assets"

FLOOR = (205, 200, 190)
WALL = (120, 60, 40)
MORTAR = (70, 35, 25)
TARGET = (220, 30, 30)
BOX = (230, 160, 40)
BOX_EDGE = (140, 80, 10)
BOX_DONE = (60, 180, 60)
BOX_DONE_EDGE = (20, 100, 20)
PLAYER = (40, 90, 230)
SKIN = (250, 215, 170)
ICE = (200, 235, 250)
ICE_LINE = (160, 205, 230)
HOLE = (20, 40, 80)
GOAL = (250, 200, 30)
START = (120, 200, 120)


def blank(colour):
    image = Image.new("RGB", (TILE_PX, TILE_PX), colour)
    return image, ImageDraw.Draw(image)


def wall():
    image, draw = blank(WALL)
    for y in range(0, TILE_PX, 14):
        draw.line([(0, y), (TILE_PX, y)], fill=MORTAR, width=3)
        offset = 0 if (y // 14) % 2 == 0 else 14
        for x in range(offset, TILE_PX, 28):
            draw.line([(x, y), (x, y + 14)], fill=MORTAR, width=3)
    return image


def floor():
    image, draw = blank(FLOOR)
    draw.rectangle([0, 0, TILE_PX - 1, TILE_PX - 1], outline=(185, 180, 170), width=2)
    return image


def target(image=None):
    image = image or floor()
    draw = ImageDraw.Draw(image)
    draw.ellipse([12, 12, 44, 44], outline=TARGET, width=5)
    draw.ellipse([23, 23, 33, 33], fill=TARGET)
    return image


def box(fill, edge):
    image = floor()
    draw = ImageDraw.Draw(image)
    draw.rectangle([6, 6, 49, 49], fill=fill, outline=edge, width=4)
    draw.line([(8, 8), (47, 47)], fill=edge, width=4)
    draw.line([(47, 8), (8, 47)], fill=edge, width=4)
    return image


def person(image, body=PLAYER):
    draw = ImageDraw.Draw(image)
    draw.ellipse([20, 6, 36, 22], fill=SKIN, outline=(0, 0, 0), width=2)
    draw.polygon([(28, 22), (12, 50), (44, 50)], fill=body, outline=(0, 0, 0))
    return image


def ice():
    image, draw = blank(ICE)
    draw.line([(6, 40), (22, 30)], fill=ICE_LINE, width=3)
    draw.line([(34, 14), (50, 8)], fill=ICE_LINE, width=3)
    return image


def hole(image=None):
    image = image or ice()
    ImageDraw.Draw(image).ellipse([4, 8, 51, 47], fill=HOLE, outline=(10, 20, 40), width=3)
    return image


def goal(image=None):
    image = image or ice()
    draw = ImageDraw.Draw(image)
    draw.rectangle([10, 18, 46, 50], fill=GOAL, outline=(150, 110, 0), width=3)
    draw.rectangle([25, 18, 31, 50], fill=(220, 40, 40))
    draw.polygon([(28, 18), (14, 6), (18, 18)], fill=(220, 40, 40))
    draw.polygon([(28, 18), (42, 6), (38, 18)], fill=(220, 40, 40))
    return image


def start():
    image = ice()
    ImageDraw.Draw(image).rectangle([8, 8, 47, 47], outline=START, width=5)
    return image


def tiles():
    crossed = hole()
    draw = ImageDraw.Draw(crossed)
    draw.line([(12, 12), (44, 44)], fill=(230, 30, 30), width=6)
    draw.line([(44, 12), (12, 44)], fill=(230, 30, 30), width=6)
    on_goal = goal()
    person(on_goal, body=(40, 170, 60))
    return {
        "sokoban_wall": wall(),
        "sokoban_floor": floor(),
        "sokoban_target": target(),
        "sokoban_box": box(BOX, BOX_EDGE),
        "sokoban_box_on_target": box(BOX_DONE, BOX_DONE_EDGE),
        "sokoban_player": person(floor()),
        "sokoban_player_on_target": person(target()),
        "frozenlake_ice": ice(),
        "frozenlake_hole": hole(),
        "frozenlake_goal": goal(),
        "frozenlake_start": start(),
        "frozenlake_player": person(ice(), body=(230, 110, 20)),
        "frozenlake_player_in_hole": crossed,
        "frozenlake_player_on_goal": on_goal,
    }


if __name__ == "__main__":
    ASSETS.mkdir(parents=True, exist_ok=True)
    for name, image in tiles().items():
        image.save(ASSETS / f"{name}.png")
        print(ASSETS / f"{name}.png")
