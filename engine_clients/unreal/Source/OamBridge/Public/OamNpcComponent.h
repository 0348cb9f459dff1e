// OamNpcComponent.h - one NPC of the bridge per actor, with its own events, for Blueprints and C++.
#pragma once

#include "CoreMinimal.h"
#include "Components/ActorComponent.h"

#include "OamBridgeTypes.h"

#include "OamNpcComponent.generated.h"

class UOamBridgeSubsystem;

// This NPC's events, on the game thread, only while the component exists.
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FOamNpcCreatedSignature, bool, bSuccess, const FOamError&, Error);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_ThreeParams(FOamNpcTextDeltaSignature, const FString&, TurnId, const FString&, Delta, bool, bIsReset);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FOamNpcToolCallSignature, const FOamToolCall&, Call);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FOamNpcTurnCompletedSignature, const FOamTurnResult&, Result);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FOamNpcDecisionSignature, const FOamDecision&, Decision);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FOamNpcTurnFailedSignature, const FString&, TurnId, const FOamError&, Error);

/**
 * An NPC of oam-bridge on an actor: Config (persona, tools, tags, fallbacks) is sent with
 * npc/create at BeginPlay, the NPC is deleted at EndPlay. Respond / Decide here (or the async
 * nodes "NPC Respond" / "NPC Decide") stream this NPC's events to this component's delegates only.
 * Uses the game instance's UOamBridgeSubsystem (one bridge process for every NPC).
 */
UCLASS(ClassGroup = (AI), meta = (BlueprintSpawnableComponent))
class OAMBRIDGE_API UOamNpcComponent : public UActorComponent
{
	GENERATED_BODY()

public:
	UOamNpcComponent();
	UOamNpcComponent(FVTableHelper& Helper);
	virtual ~UOamNpcComponent() override;

	virtual void EndPlay(const EEndPlayReason::Type EndPlayReason) override;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FOamNpcConfig Config;

	/** npc/create at BeginPlay (else call CreateNpc). */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	bool bCreateOnBeginPlay = true;

	/** npc/delete at EndPlay. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	bool bDeleteOnEndPlay = true;

	/** Config.NpcId, or the owning actor's name when that is empty. */
	UFUNCTION(BlueprintPure, Category = "OAM Bridge")
	FString GetNpcId() const;

	/** npc/create from Config (replacing Config.NpcId's NPC). OnCreated follows. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool CreateNpc();

	/** npc/respond: Speaker (another NPC's id or any name; empty: the player) says Prompt. OnTextDelta, OnToolCall, then OnTurnCompleted or OnTurnFailed. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "Speaker"))
	bool Respond(const FString& Prompt, const FString& Speaker);

	/** npc/decide: the NPC picks one of Options for Situation. OnDecision and OnTurnCompleted, or OnTurnFailed. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "bReasoning,bRemember"))
	bool Decide(const FString& Situation, const TArray<FOamDecisionOption>& Options, bool bReasoning = true, bool bRemember = false);

	/** npc/prewarm: when the player comes near. OnTurnCompleted (FinishReason "prewarmed"). Speaker: who will speak to the NPC next (another NPC's id or any name; empty: the player); PromptPrefix: how that line starts, when the game knows. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "Speaker,PromptPrefix"))
	bool Prewarm(const FString& Speaker = TEXT(""), const FString& PromptPrefix = TEXT(""));

	/** npc/cancel: running and queued turns end with OnTurnFailed (Code "cancelled"). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool Cancel();

	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool SetTags(const TArray<FString>& Tags);

	/** Answers OnToolCall: OutputJson is any JSON value, e.g. {"opened":"north"} or "done" with quotes. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool SubmitToolOutput(const FString& CallId, const FString& OutputJson);

	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool SubmitToolError(const FString& CallId, const FString& Error);

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamNpcCreatedSignature OnCreated;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamNpcTextDeltaSignature OnTextDelta;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamNpcToolCallSignature OnToolCall;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamNpcTurnCompletedSignature OnTurnCompleted;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamNpcDecisionSignature OnDecision;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamNpcTurnFailedSignature OnTurnFailed;

	// For C++ and the async nodes: a turn with its own callbacks besides the delegates above
	// (game thread; not called once this component is gone). Returns false (and calls OnDone
	// with the error) when nothing was sent.
	struct FTurnHandlers
	{
		TFunction<void(const FOamTurnResult& Partial)> OnDelta;
		TFunction<void(bool bSuccess, const FOamTurnResult& Result, const FOamDecision& Decision, const FOamError& Error)> OnDone;
	};
	bool StartRespond(const FString& Prompt, const FString& Speaker, FTurnHandlers Handlers);
	bool StartDecide(const FString& Situation, const TArray<FOamDecisionOption>& Options, bool bReasoning, bool bRemember, FTurnHandlers Handlers);

	UOamBridgeSubsystem* GetBridge() const;

protected:
	virtual void BeginPlay() override;

private:
	bool Fail(const FTurnHandlers& Handlers, const FString& Code, const FString& Message);
};
